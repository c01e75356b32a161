// requantize.h: the requantization epilogues, one inline function per numerics (see docs/quantization.md).
#pragma once

#include <cmath>
#include <cstdint>

namespace qmm {

// static inline: kernel files built with AVX-512 or AMX flags include this header too; with external
// linkage an out-of-line copy from such a file could be the one the linker keeps for every caller.

// ONNX Runtime / MLAS (MlasRequantizeOutput): float32 multiply, clamp to [qmin - zp, qmax - zp] with
// the operand order of maxps/minps (a NaN becomes the lower bound, as in MLAS), round half to even
// (cvtps_epi32 under the default rounding mode), add the zero point.
static inline int32_t requantize_onnxruntime(int32_t acc, float multiplier, int32_t zp, int32_t qmin, int32_t qmax) {
  float v = static_cast<float>(acc) * multiplier;
  const float lo = static_cast<float>(qmin - zp);
  const float hi = static_cast<float>(qmax - zp);
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  return static_cast<int32_t>(std::nearbyint(v)) + zp;
}

// onnx.reference: D = C * multiplier (float64), D += zp (float64), rint, clip, cast.
static inline int32_t requantize_onnx_reference(int32_t acc, double multiplier, int32_t zp, int32_t qmin,
                                                int32_t qmax) {
  double d = static_cast<double>(acc) * multiplier;
  d += static_cast<double>(zp);
  d = std::nearbyint(d);
  if (std::isnan(d)) return 0;
  if (d < qmin) return qmin;
  if (d > qmax) return qmax;
  return static_cast<int32_t>(d);
}

// Exact: round half to even of acc * a_scale * b_scale / y_scale computed without any rounding, then
// + zp and saturate. Defined in requantize.cpp (128-bit integer arithmetic on the scales' mantissas).
int32_t requantize_exact(int64_t acc, float a_scale, float b_scale, float y_scale, int32_t zp, int32_t qmin,
                         int32_t qmax);

}  // namespace qmm
