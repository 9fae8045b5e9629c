# Finds every external dependency with find_package / pkg-config. No third-party source lives in
# this repository; third_party/README.md lists where each one comes from and the tested versions.

# ska_require(<found-var> <what> <debian-package>): a clear error naming the package to install.
function(ska_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "SKA needs ${what}. On Debian/Ubuntu: apt-get install ${package} "
                        "(or run scripts/setup.sh, which installs everything missing).")
  endif()
endfunction()

find_package(OpenMP)
ska_require(OpenMP_CXX_FOUND "OpenMP" "libomp-dev")

# CPU GEMM: OpenBLAS (CBLAS interface).
find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  add_library(ska_blas INTERFACE)
  target_include_directories(ska_blas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(ska_blas INTERFACE ${OpenBLAS_LIBRARIES})
else()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
  endif()
  ska_require(OPENBLAS_FOUND "OpenBLAS" "libopenblas-dev")
  add_library(ska_blas INTERFACE)
  target_link_libraries(ska_blas INTERFACE PkgConfig::OPENBLAS)
endif()

find_package(Threads REQUIRED)

# Collectives between CPU workers (src/distributed, private to ska): Gloo, whose Debian package
# installs a CMake config exporting the imported target `gloo`.
find_package(Gloo CONFIG QUIET)
ska_require(Gloo_FOUND "Gloo" "libgloo-dev")

# JSON (safetensors headers, configs): header-only nlohmann-json.
find_package(nlohmann_json 3 QUIET)
ska_require(nlohmann_json_FOUND "nlohmann-json 3" "nlohmann-json3-dev")

# YAML configs (src/config; private to ska): yaml-cpp, whose Debian package exports `yaml-cpp`.
find_package(yaml-cpp QUIET)
ska_require(yaml-cpp_FOUND "yaml-cpp" "libyaml-cpp-dev")

# JPEG and PNG decoding (src/data/datasets/image_decode.cpp; private to ska): libjpeg (Debian's
# libjpeg-turbo) and libpng, through CMake's own find modules.
find_package(JPEG QUIET)
ska_require(JPEG_FOUND "libjpeg" "libjpeg-dev")
find_package(PNG QUIET)
ska_require(PNG_FOUND "libpng" "libpng-dev")

# The other image formats (BMP, PNM, TIFF, WebP) for the data pipeline and `inference` (private to
# ska). SKA_OPENCV=OFF builds without it (a GPU machine with no package registry, say): files in
# those formats then fail with a message; JPEG, PNG and the binary datasets still work.
option(SKA_OPENCV "Decode BMP, PNM, TIFF and WebP files with OpenCV" ON)
if(SKA_OPENCV)
  find_package(OpenCV QUIET COMPONENTS core imgproc imgcodecs)
  ska_require(OpenCV_FOUND "OpenCV (core, imgproc, imgcodecs)" "libopencv-dev")
endif()

# zlib: gzip'd IDX files and compressed MAT elements in the dataset readers (private to ska).
find_package(ZLIB QUIET)
ska_require(ZLIB_FOUND "zlib" "zlib1g-dev")

# Command-line parsing of the apps (header-only).
find_package(CLI11 QUIET)
ska_require(CLI11_FOUND "CLI11" "libcli11-dev")

# Console and log-file output of the apps (train, validate).
find_package(spdlog QUIET)
ska_require(spdlog_FOUND "spdlog" "libspdlog-dev")

if(SKA_BUILD_TESTS)
  find_package(Catch2 2 QUIET)
  ska_require(Catch2_FOUND "Catch2 v2" "catch2")
endif()

if(SKA_CUDA)
  find_package(CUDAToolkit REQUIRED)
  # cuDNN: headers and library beside the toolkit, or where CUDNN_ROOT points.
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
    message(FATAL_ERROR "SKA_CUDA=ON needs cuDNN 9 (cudnn.h, libcudnn.so): install NVIDIA's "
                        "cudnn9-cuda-13 package or set -DCUDNN_ROOT=<dir>; or configure with -DSKA_CUDA=OFF")
  endif()
  add_library(ska_cudnn INTERFACE)
  target_include_directories(ska_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  target_link_libraries(ska_cudnn INTERFACE ${CUDNN_LIBRARY})
  message(STATUS "SKA: cuDNN ${CUDNN_LIBRARY}")

  # NCCL (src/distributed on CUDA): beside the toolkit, where NCCL_ROOT points, or in the pip wheel
  # nvidia-nccl-cu13 (scripts/gpu_env.sh exports its folder as NCCL_ROOT).
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "SKA_CUDA=ON needs NCCL 2 (nccl.h, libnccl.so): install NVIDIA's "
                        "libnccl-dev package (or the pip wheel nvidia-nccl-cu13) or set "
                        "-DNCCL_ROOT=<dir>; or configure with -DSKA_CUDA=OFF")
  endif()
  add_library(ska_nccl INTERFACE)
  target_include_directories(ska_nccl INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(ska_nccl INTERFACE ${NCCL_LIBRARY})
  message(STATUS "SKA: NCCL ${NCCL_LIBRARY}")
elseif(SKA_CUDA_EMULATION)
  # The toolkit's, cuDNN's and NCCL's headers only: tests/emu answers their calls on the host.
  find_package(CUDAToolkit REQUIRED)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  if(NOT CUDNN_INCLUDE_DIR OR NOT NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "SKA_CUDA_EMULATION=ON needs cudnn.h and nccl.h (the headers of cuDNN 9 "
                        "and NCCL 2): set -DCUDNN_ROOT=<dir> and -DNCCL_ROOT=<dir>")
  endif()
  add_library(ska_cudnn INTERFACE)
  target_include_directories(ska_cudnn SYSTEM INTERFACE ${CUDNN_INCLUDE_DIR})
  add_library(ska_nccl INTERFACE)
  target_include_directories(ska_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
endif()
