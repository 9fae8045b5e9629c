#!/usr/bin/env bash
# Prints a short hash of what the programs are built from (src, cuda, apps, tests, third_party,
# CMakeLists.txt), from the files themselves, so that it can be compared on a machine whose copy
# of the checkout has no git history (scripts/gpu_prebuild.sh, scripts/gpu_session.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
find src cuda apps tests third_party CMakeLists.txt -type f ! -path '*/__pycache__/*' -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
