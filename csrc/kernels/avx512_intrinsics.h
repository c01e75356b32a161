// avx512_intrinsics.h: the AVX-512 intrinsics of a kernel file: <immintrin.h> natively, SIMDe's portable ones in its emulated build (QMM_EMULATED).
//
// Include it first among the intrinsics; the emulations that replace what SIMDe lacks
// (amx_emulation.h, bf16_emulation.h) come after it, since they use its AVX-512 types.
#pragma once

#if defined(QMM_EMULATED)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif
