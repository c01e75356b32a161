// bf16_emulation.h: vdpbf16ps (_mm512_dpbf16_ps) in the hardware's order, for the kernel builds with QMM_EMULATED.
//
// Written from Intel's pseudo-code of VDPBF16PS (SDM; intrinsics guide): for each 32-bit lane i,
//   acc.fp32[i] += make_fp32(a.bf16[2i+1]) * make_fp32(b.bf16[2i+1])
//   acc.fp32[i] += make_fp32(a.bf16[2i+0]) * make_fp32(b.bf16[2i+0])
// each line one float32 fused multiply-add with denormal inputs read as zero (DAZ), a denormal
// result flushed to zero (FTZ) and rounding to nearest even, MXCSR neither read nor written;
// make_fp32 puts the 16 bits of a bfloat16 above 16 zero bits. The odd-indexed pair (a word's high
// half) goes first. SIMDe's _mm512_dpbf16_ps (0.8.2) adds the even-indexed product first, or the
// sum of the two products, and flushes nothing: not the hardware's bits, so the emulated build of
// the pair table calls this instead.
//
// Each line is qmm_bf16_scalar::fma_daz_ftz (kernels/bf16_scalar.h: std::fma with DAZ and FTZ done
// explicitly).
//
// Include after SIMDe's AVX-512 header (with SIMDE_ENABLE_NATIVE_ALIASES); internal linkage only.
#pragma once

#include <cstdint>

#include "bf16_scalar.h"

namespace qmm_bf16_emulation {
namespace {

using qmm_bf16_scalar::fma_daz_ftz;
using qmm_bf16_scalar::high_half;
using qmm_bf16_scalar::low_half;

// _mm512_dpbf16_ps(acc, a, b), a and b as 16 words of two bfloat16 each.
__m512 dpbf16_ps(__m512 acc, __m512i a, __m512i b) {
  alignas(64) float s[16];
  alignas(64) uint32_t wa[16], wb[16];
  _mm512_store_ps(s, acc);
  _mm512_store_si512(wa, a);
  _mm512_store_si512(wb, b);
  for (int i = 0; i < 16; ++i) {
    s[i] = fma_daz_ftz(high_half(wa[i]), high_half(wb[i]), s[i]);
    s[i] = fma_daz_ftz(low_half(wa[i]), low_half(wb[i]), s[i]);
  }
  return _mm512_load_ps(s);
}

}  // namespace
}  // namespace qmm_bf16_emulation
