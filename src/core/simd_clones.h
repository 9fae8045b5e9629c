// SKA_CPU_SIMD_CLONES: compiles a function three times, for AVX-512 (x86-64-v4), AVX2+FMA (v3) and
// the baseline ISA, and picks one at load time (GCC function multiversioning): the build stays
// portable (no -march=native) and loops still get 16- or 8-wide vectors where the CPU has them
// (AVX-512 doubled GELU's throughput on the development machine). Elsewhere it expands to nothing.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define SKA_CPU_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SKA_CPU_SIMD_CLONES
#endif
