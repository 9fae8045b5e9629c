#!/usr/bin/env bash
# Installs the Debian packages the build, tests and quick start need, if any is missing.
# Idempotent and quiet when everything is there. Needs root (or sudo) only when installing.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config ccache   # toolchain
  catch2                                    # tests
  libopenblas-dev                           # CPU GEMM
  nlohmann-json3-dev                        # safetensors headers
  libyaml-cpp-dev                           # YAML configs
  libjpeg-dev libpng-dev                    # JPEG and PNG decoding (ImageNet folders, inference)
  libopencv-dev                             # BMP, PNM, TIFF, WebP decoding
  zlib1g-dev                                # gzip/zlib in the dataset readers
  libcli11-dev                              # command-line parsing (apps)
  dataset-fashion-mnist                     # quick start and the end-to-end training test
  libspdlog-dev                             # console and log files (train, validate)
  libgloo-dev                               # CPU collectives (data parallelism on CPUs)
  clang libclang-rt-14-dev                  # fuzz targets: libFuzzer and sanitizer runtimes
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
