// The Catch2 main of the test executable. CUDA results are compared with the CPU at f32
// tolerances, so the run starts with TF32 off for convolutions too (matrix products default to
// off); tests of the TF32 policy itself switch it on with a Tf32Guard.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "core/precision.h"

int main(int argc, char* argv[]) {
  ska::set_tf32_policy({/*matmul=*/false, /*conv=*/false});
  return Catch::Session().run(argc, argv);
}
