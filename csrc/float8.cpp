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
};

Format format(Float8 type) {
  switch (type) {
    case Float8::kE4M3FN: return {3, 7, 0x7E, 0x7F, false};
    case Float8::kE4M3FNUZ: return {3, 8, 0x7F, 0x80, true};
    case Float8::kE5M2: return {2, 15, 0x7B, 0x7E, false};
    case Float8::kE5M2FNUZ: return {2, 16, 0x7F, 0x80, true};
  }
  return {3, 7, 0x7E, 0x7F, false};
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
  const float min_normal = std::ldexp(1.0f, 1 - f.bias);
  if (a < min_normal) {  // subnormal (or zero): a multiple of 2^(1 - bias - m), exact scaling, then RNE
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, f.bias - 1 + f.mantissa_bits)));
  } else {  // drop 23 - m mantissa bits with round to nearest even, then rebias the exponent
    const int shift = 23 - f.mantissa_bits;
    const uint32_t rounded = (bits + ((1u << (shift - 1)) - 1) + ((bits >> shift) & 1)) >> shift;
    code = rounded - (static_cast<uint32_t>(127 - f.bias) << f.mantissa_bits);
  }
  if (f.fnuz && code == 0) return 0;
  return static_cast<uint8_t>(code | sign);
}

}  // namespace

void float32_to_float8(const float* x, int64_t count, Float8 type, uint8_t* out) {
  const Format f = format(type);
  const uint8_t max_code = f.max_code;
  // The largest finite value, decoded from its code (exponent field, then mantissa field).
  const int exponent = (max_code >> f.mantissa_bits) - f.bias;
  const float fraction = 1.0f + static_cast<float>(max_code & ((1 << f.mantissa_bits) - 1)) / (1 << f.mantissa_bits);
  const float max_value = std::ldexp(fraction, exponent);
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((count + kChunk - 1) / kChunk, [&](int64_t task) {
    const int64_t begin = task * kChunk, end = begin + kChunk < count ? begin + kChunk : count;
    for (int64_t i = begin; i < end; ++i) out[i] = encode(x[i], f, max_value);
  });
}

}  // namespace qmm
