# Sourced (`. scripts/gpu_env.sh`) on a GPU machine that lacks our Debian packages: points CMake, the
# compiler and the loader at the carried ones (.deps, from ../shared/tools/device-deps.sh) and at
# the cuDNN and NCCL of PyTorch's Python wheels when they are not beside the CUDA toolkit. Sets
# CUDNN_ROOT for CMake. Safe to source twice.
if [ -d .deps/root/usr ]; then
  D=$PWD/.deps/root/usr
  export CMAKE_PREFIX_PATH=$D:$D/lib/x86_64-linux-gnu/cmake:$D/share/cmake:$D/lib/cmake:${CMAKE_PREFIX_PATH:-}
  # $D/lib: Debian installs libgloo there, not under the multiarch folder.
  export LD_LIBRARY_PATH=$D/lib/x86_64-linux-gnu:$D/lib/x86_64-linux-gnu/openblas-pthread:$D/lib:${LD_LIBRARY_PATH:-}
  # The multiarch folder holds libjpeg's jconfig.h (as gcc's own default path does on Debian).
  export CPATH=$D/include:$D/include/x86_64-linux-gnu:${CPATH:-}
fi
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
# cuBLAS and the CUDA runtime for programs built elsewhere (scripts/gpu_prebuild.sh), which carry
# no path to them.
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

# A wheel's package directory: nvidia.cudnn and nvidia.nccl are namespace packages (no __file__).
ska_wheel_dir() { python3 -c "import $1; print(list($1.__path__)[0])" 2>/dev/null || true; }
if [ ! -f /usr/local/cuda/include/cudnn.h ] && [ -z "${CUDNN_ROOT:-}" ]; then
  CUDNN_ROOT=$(ska_wheel_dir nvidia.cudnn)
fi
if [ -n "${CUDNN_ROOT:-}" ]; then
  export CUDNN_ROOT
  export LD_LIBRARY_PATH=$CUDNN_ROOT/lib:${LD_LIBRARY_PATH:-}
  # The wheel ships libcudnn.so.9 only; give the linker the unversioned name.
  [ -e "$CUDNN_ROOT/lib/libcudnn.so" ] || ln -sf libcudnn.so.9 "$CUDNN_ROOT/lib/libcudnn.so" 2>/dev/null || true
fi
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -z "${NCCL_ROOT:-}" ]; then
  NCCL_ROOT=$(ska_wheel_dir nvidia.nccl)
fi
if [ -n "${NCCL_ROOT:-}" ]; then
  export NCCL_ROOT
  export LD_LIBRARY_PATH=$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}
  [ -e "$NCCL_ROOT/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$NCCL_ROOT/lib/libnccl.so" 2>/dev/null || true
fi
