// bf16_scalar.h: scalar steps of the bfloat16 dot-product instructions (make_fp32, DAZ/FTZ, the fused step), for their emulations.
//
// Shared by kernels/bf16_emulation.h (vdpbf16ps) and kernels/amx_emulation.h (tdpbf16ps), both
// written from Intel's pseudo-code, where every step is a float32 fused multiply-add with
// denormal inputs read as zero (DAZ), a denormal result flushed to zero (FTZ) and rounding to
// nearest even, MXCSR neither read nor written; make_fp32 puts the 16 bits of a bfloat16 above 16
// zero bits. Here each step is std::fma or a float addition (correctly rounded in the thread's
// rounding mode: the default nearest-even, which nothing in quantmatmul changes), with DAZ and FTZ
// done explicitly: a value whose exponent field is 0 becomes the zero of its sign. The flush
// applies to the rounded result (one that rounds up to the smallest normal is kept); the
// hardware's tininess rule for FTZ is not spelled out, but in quantmatmul's use no denormal input,
// sum or product arises at all (docs/quantization.md, "bfloat16 pairs"), so no result depends on
// it. NaN payloads are not modelled (the pair tables never see a NaN). Internal linkage only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace qmm_bf16_scalar {
namespace {

// DAZ / FTZ: a denormal becomes the zero of its sign; every other value (zeros included) stays.
inline float flush_denormal(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// make_fp32 of a word's bfloat16: high half (the odd-indexed one) or low half (the even-indexed one).
inline float high_half(uint32_t word) {
  const uint32_t u = word & 0xFFFF0000u;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline float low_half(uint32_t word) { return high_half(word << 16); }

// acc + x * y, fused, with DAZ on its three inputs and FTZ on its result.
inline float fma_daz_ftz(float x, float y, float acc) {
  return flush_denormal(std::fma(flush_denormal(x), flush_denormal(y), flush_denormal(acc)));
}

// x + y with DAZ on both and FTZ on the result.
inline float add_daz_ftz(float x, float y) { return flush_denormal(flush_denormal(x) + flush_denormal(y)); }

}  // namespace
}  // namespace qmm_bf16_scalar
