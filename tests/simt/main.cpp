// The Catch2 main of ska_simt_tests (the CUDA kernels' code run on the host, tests/simt/simt.h).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
