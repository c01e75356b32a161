// float8.h: float32 to float8 conversion (round to nearest even, saturating), for the float path's outputs.
#pragma once

#include <cstdint>

namespace qmm {

enum class Float8 { kE4M3FN = 0, kE4M3FNUZ = 1, kE5M2 = 2, kE5M2FNUZ = 3 };

// A float8 type's encoding, as the conversion needs it (float8.cpp; the kernel files' row step).
struct Float8Format {
  int mantissa_bits, bias;
  uint8_t max_code, nan_code;  // magnitudes; nan_code includes the sign bit for the fnuz types
  bool fnuz;  // one NaN (0x80), no infinities, no negative zero
  // The smallest normal value 2^(1 - bias), and 2^(bias - 1 + m), which scales a value below it to
  // its subnormal code (exactly: a power of two, the product stays normal): computed once per
  // conversion (std::ldexp per element took a tenth of a float8 QLinearMatMul).
  float min_normal, subnormal_scale;
  float max_value;  // the largest finite value
};
Float8Format float8_format(Float8 type);

// float8_output's step for one row where every parameter is broadcast or contiguous along n: p[i]
// the row's first a_scale, b_scale, y_scale, y_zero_point value, step[i] 0 (broadcast) or 1; the
// same float32 operations and integer steps, so the same bytes (an entry's optional fast path,
// Float8Dispatch::encode_row).
using Float8EncodeRow = void (*)(const float* d, int64_t count, const float* const p[4], const int64_t step[4],
                                 const Float8Format& f, uint8_t* out);

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
