// float8.cpp: float32 to float8 conversion by integer arithmetic on the float32 bits (round to nearest even, saturating).
#include "float8.h"

#include <cmath>
#include <cstring>

#include "thread_pool.h"

namespace qmm {
namespace {

struct Format {
  int mantissa_bits, bias;
  uint8_t max_code, nan_code;  // magnitudes; nan_code includes the sign bit for the fnuz types
  bool fnuz;  // one NaN (0x80), no infinities, no negative zero
  // The smallest normal value 2^(1 - bias), and 2^(bias - 1 + m), which scales a value below it to
  // its subnormal code (exactly: a power of two, the product stays normal): computed once per
  // conversion (std::ldexp per element took a tenth of a float8 QLinearMatMul).
  float min_normal, subnormal_scale;
};

Format format(Float8 type) {
  Format f{3, 7, 0x7E, 0x7F, false, 0.0f, 0.0f};
  switch (type) {
    case Float8::kE4M3FN: f = {3, 7, 0x7E, 0x7F, false, 0.0f, 0.0f}; break;
    case Float8::kE4M3FNUZ: f = {3, 8, 0x7F, 0x80, true, 0.0f, 0.0f}; break;
    case Float8::kE5M2: f = {2, 15, 0x7B, 0x7E, false, 0.0f, 0.0f}; break;
    case Float8::kE5M2FNUZ: f = {2, 16, 0x7F, 0x80, true, 0.0f, 0.0f}; break;
  }
  f.min_normal = std::ldexp(1.0f, 1 - f.bias);
  f.subnormal_scale = std::ldexp(1.0f, f.bias - 1 + f.mantissa_bits);
  return f;
}

uint8_t encode(float v, const Format& f, float max_value) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (std::isnan(v)) return f.fnuz ? f.nan_code : static_cast<uint8_t>(f.nan_code | sign);
  float a = std::fabs(v);
  if (a > max_value) a = max_value;  // saturate (infinities too)
  std::memcpy(&bits, &a, 4);
  uint32_t code;
  if (a < f.min_normal) {  // subnormal (or zero): a multiple of 2^(1 - bias - m), exact scaling, then RNE
    code = static_cast<uint32_t>(std::nearbyint(a * f.subnormal_scale));
  } else {  // drop 23 - m mantissa bits with round to nearest even, then rebias the exponent
    const int shift = 23 - f.mantissa_bits;
    const uint32_t rounded = (bits + ((1u << (shift - 1)) - 1) + ((bits >> shift) & 1)) >> shift;
    code = rounded - (static_cast<uint32_t>(127 - f.bias) << f.mantissa_bits);
  }
  if (f.fnuz && code == 0) return 0;
  return static_cast<uint8_t>(code | sign);
}

// The largest finite value of the format, decoded from its code (exponent field, then mantissa field).
float max_finite(const Format& f) {
  const int exponent = (f.max_code >> f.mantissa_bits) - f.bias;
  const float fraction = 1.0f + static_cast<float>(f.max_code & ((1 << f.mantissa_bits) - 1)) / (1 << f.mantissa_bits);
  return std::ldexp(fraction, exponent);
}

}  // namespace

void float32_to_float8(const float* x, int64_t count, Float8 type, uint8_t* out) {
  const Format f = format(type);
  const float max_value = max_finite(f);
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((count + kChunk - 1) / kChunk, [&](int64_t task) {
    const int64_t begin = task * kChunk, end = begin + kChunk < count ? begin + kChunk : count;
    for (int64_t i = begin; i < end; ++i) out[i] = encode(x[i], f, max_value);
  });
}

void float8_output(const float* d, int64_t B, int64_t M, int64_t N, Float8OutputParams a_scale,
                   Float8OutputParams b_scale, Float8OutputParams y_scale, Float8OutputParams y_zero_point, Float8 type,
                   uint8_t* out) {
  const Format f = format(type);
  const float max_value = max_finite(f);
  const int64_t rows_per_task = N >= (1 << 14) ? 1 : (1 << 14) / (N > 0 ? N : 1);
  parallel_for((B * M + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
    const int64_t r1 = (task + 1) * rows_per_task < B * M ? (task + 1) * rows_per_task : B * M;
    for (int64_t r = task * rows_per_task; r < r1; ++r) {
      const int64_t b = r / M, m = r % M;
      for (int64_t n = 0; n < N; ++n) {
        const float scale = a_scale.at(b, m, n) * b_scale.at(b, m, n);
        const float x = d[r * N + n] * scale;
        const float v = x / y_scale.at(b, m, n) + y_zero_point.at(b, m, n);
        out[r * N + n] = encode(v, f, max_value);
      }
    }
  });
}

void lookup_float32(const uint8_t* q, int64_t count, const float* table, float* out) {
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((count + kChunk - 1) / kChunk, [&](int64_t task) {
    const int64_t begin = task * kChunk, end = begin + kChunk < count ? begin + kChunk : count;
    for (int64_t i = begin; i < end; ++i) out[i] = table[q[i]];
  });
}

}  // namespace qmm
