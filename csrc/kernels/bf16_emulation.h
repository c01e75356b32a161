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
// Here each line is std::fma (correctly rounded in the thread's rounding mode: the default
// nearest-even, which nothing in quantmatmul changes), with DAZ and FTZ done explicitly: a value
// whose exponent field is 0 becomes the zero of its sign. The flush applies to the rounded result
// (one that rounds up to the smallest normal is kept); the hardware's tininess rule for FTZ is not
// spelled out, but in quantmatmul's use no denormal input, sum or product arises at all
// (docs/quantization.md, "bfloat16 pairs"), so no result depends on it. NaN payloads are not
// modelled (the pair tables never see a NaN).
//
// Include after SIMDe's AVX-512 header (with SIMDE_ENABLE_NATIVE_ALIASES); internal linkage only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace qmm_bf16_emulation {
namespace {

// DAZ / FTZ: a denormal becomes the zero of its sign; every other value (zeros included) stays.
float flush_denormal(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// make_fp32 of a word's bfloat16: high half (the odd-indexed one) or low half (the even-indexed one).
float high_half(uint32_t word) {
  const uint32_t u = word & 0xFFFF0000u;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
float low_half(uint32_t word) { return high_half(word << 16); }

// One step of the pseudo-code: acc + x * y, fused, with DAZ on its three inputs and FTZ on its result.
float fma_daz_ftz(float x, float y, float acc) {
  return flush_denormal(std::fma(flush_denormal(x), flush_denormal(y), flush_denormal(acc)));
}

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
