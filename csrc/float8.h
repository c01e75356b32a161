// float8.h: float32 to float8 conversion (round to nearest even, saturating), for the float path's outputs.
#pragma once

#include <cstdint>

namespace qmm {

enum class Float8 { kE4M3FN = 0, kE4M3FNUZ = 1, kE5M2 = 2, kE5M2FNUZ = 3 };

// out[i] = x[i] converted to the float8 type: clipped to +-max finite (infinities too), rounded to
// nearest even (subnormals included), NaN to the type's NaN (sign kept where the type has one);
// the same bits as numpy.clip(x, -max, max).astype(<ml_dtypes float8 type>). The fnuz types have
// no negative zero: -0 (and a negative value rounding to 0) gives 0x00.
void float32_to_float8(const float* x, int64_t count, Float8 type, uint8_t* out);

// The float path's output step (docs/quantization.md, steps 3-4) for a float8 output, element by
// element over [B, M, N]: x = f32(d * f32(a_scale * b_scale)), v = f32(f32(x / y_scale) + y_zp),
// then v converted as float32_to_float8 does: the same float32 operations, in the same order, as
// numpy's d * (a_scale * b_scale) / y_scale + y_zp (so the same bits, NaN signs included). d is
// contiguous; each parameter is a float32 [B, M, N] view (index = b * s0 + m * s1 + n * s2; zero
// strides where broadcast). Rows on the thread pool.
struct Float8OutputParams {
  const float* data;
  int64_t s0, s1, s2;
  float at(int64_t b, int64_t m, int64_t n) const { return data[b * s0 + m * s1 + n * s2]; }
};
void float8_output(const float* d, int64_t B, int64_t M, int64_t N, Float8OutputParams a_scale,
                   Float8OutputParams b_scale, Float8OutputParams y_scale, Float8OutputParams y_zero_point, Float8 type,
                   uint8_t* out);

// out[i] = table[q[i]] (an 8-bit type's values as float32), in chunks on the thread pool.
void lookup_float32(const uint8_t* q, int64_t count, const float* table, float* out);

}  // namespace qmm
