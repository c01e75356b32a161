// float8.cpp: float32 to float8 conversion by integer arithmetic on the float32 bits (round to nearest even, saturating).
#include "float8.h"

#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dispatch.h"
#include "thread_pool.h"

namespace qmm {
namespace {

uint8_t encode(float v, const Float8Format& f) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  if (std::isnan(v)) return f.fnuz ? f.nan_code : static_cast<uint8_t>(f.nan_code | sign);
  float a = std::fabs(v);
  if (a > f.max_value) a = f.max_value;  // saturate (infinities too)
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

#if defined(__SSE2__)
// encode() on four lanes (SSE2): the same integer steps, lane by lane, so the same codes.
__m128i encode4(__m128 v, const Float8Format& f) {
  const __m128i bits = _mm_castps_si128(v);
  __m128i sign = _mm_and_si128(_mm_srli_epi32(bits, 24), _mm_set1_epi32(0x80));
  const __m128 is_nan = _mm_cmpunord_ps(v, v);
  const __m128 a = _mm_min_ps(_mm_and_ps(v, _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF))), _mm_set1_ps(f.max_value));
  const __m128i abits = _mm_castps_si128(a);
  const int shift = 23 - f.mantissa_bits;
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(abits, shift), _mm_set1_epi32(1));
  const __m128i rounded =
      _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(abits, _mm_set1_epi32((1 << (shift - 1)) - 1)), odd), shift);
  const __m128i normal = _mm_sub_epi32(rounded, _mm_set1_epi32((127 - f.bias) << f.mantissa_bits));
  const __m128i subnormal = _mm_cvtps_epi32(_mm_mul_ps(a, _mm_set1_ps(f.subnormal_scale)));  // nearest even (MXCSR)
  const __m128i is_sub = _mm_castps_si128(_mm_cmplt_ps(a, _mm_set1_ps(f.min_normal)));
  const __m128i code = _mm_or_si128(_mm_and_si128(is_sub, subnormal), _mm_andnot_si128(is_sub, normal));
  if (f.fnuz) sign = _mm_andnot_si128(_mm_cmpeq_epi32(code, _mm_setzero_si128()), sign);  // no negative zero
  const __m128i nan = _mm_set1_epi32(f.nan_code);
  const __m128i nan_code =
      f.fnuz ? nan : _mm_or_si128(nan, _mm_and_si128(_mm_srli_epi32(bits, 24), _mm_set1_epi32(0x80)));
  const __m128i n = _mm_castps_si128(is_nan);
  return _mm_or_si128(_mm_and_si128(n, nan_code), _mm_andnot_si128(n, _mm_or_si128(code, sign)));
}
#endif

// The largest finite value of the format, decoded from its code (exponent field, then mantissa field).
float max_finite(const Float8Format& f) {
  const int exponent = (f.max_code >> f.mantissa_bits) - f.bias;
  const float fraction = 1.0f + static_cast<float>(f.max_code & ((1 << f.mantissa_bits) - 1)) / (1 << f.mantissa_bits);
  return std::ldexp(fraction, exponent);
}

}  // namespace

Float8Format float8_format(Float8 type) {
  Float8Format f{3, 7, 0x7E, 0x7F, false, 0.0f, 0.0f, 0.0f};
  switch (type) {
    case Float8::kE4M3FN: f = {3, 7, 0x7E, 0x7F, false, 0.0f, 0.0f, 0.0f}; break;
    case Float8::kE4M3FNUZ: f = {3, 8, 0x7F, 0x80, true, 0.0f, 0.0f, 0.0f}; break;
    case Float8::kE5M2: f = {2, 15, 0x7B, 0x7E, false, 0.0f, 0.0f, 0.0f}; break;
    case Float8::kE5M2FNUZ: f = {2, 16, 0x7F, 0x80, true, 0.0f, 0.0f, 0.0f}; break;
  }
  f.min_normal = std::ldexp(1.0f, 1 - f.bias);
  f.subnormal_scale = std::ldexp(1.0f, f.bias - 1 + f.mantissa_bits);
  f.max_value = max_finite(f);
  return f;
}

void float32_to_float8(const float* x, int64_t count, Float8 type, uint8_t* out) {
  const Float8Format f = float8_format(type);
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((count + kChunk - 1) / kChunk, [&](int64_t task) {
    const int64_t begin = task * kChunk, end = begin + kChunk < count ? begin + kChunk : count;
    for (int64_t i = begin; i < end; ++i) out[i] = encode(x[i], f);
  });
}

void float8_output(const float* d, int64_t B, int64_t M, int64_t N, Float8OutputParams a_scale,
                   Float8OutputParams b_scale, Float8OutputParams y_scale, Float8OutputParams y_zero_point, Float8 type,
                   uint8_t* out) {
  const Float8Format f = float8_format(type);
  const int64_t rows_per_task = N >= (1 << 14) ? 1 : (1 << 14) / (N > 0 ? N : 1);
  const Float8EncodeRow encode_row = float8_kernels().encode_row;  // the entry's, where it has one
  // Every parameter broadcast or contiguous along n (the same for every row): the vector steps.
  const Float8OutputParams* params[4] = {&a_scale, &b_scale, &y_scale, &y_zero_point};
  bool rowwise = true;
  for (const Float8OutputParams* p : params) rowwise = rowwise && (p->s2 == 0 || p->s2 == 1);
  parallel_for((B * M + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
    const int64_t r1 = (task + 1) * rows_per_task < B * M ? (task + 1) * rows_per_task : B * M;
    for (int64_t r = task * rows_per_task; r < r1; ++r) {
      const int64_t b = r / M, m = r % M;
      int64_t n = 0;
      if (rowwise && encode_row) {
        const float* first[4];
        int64_t step[4];
        for (int i = 0; i < 4; ++i) {
          first[i] = &params[i]->data[b * params[i]->s0 + m * params[i]->s1];
          step[i] = params[i]->s2;
        }
        encode_row(d + r * N, N, first, step, f, out + r * N);
        continue;
      }
#if defined(__SSE2__)
      // Four columns at a time: the same float32 operations (IEEE, lane by lane) and the same
      // integer conversion.
      if (rowwise) {
        auto load4 = [&](const Float8OutputParams& p) {
          const float* at = &p.data[b * p.s0 + m * p.s1 + n * p.s2];
          return p.s2 == 0 ? _mm_set1_ps(*at) : _mm_loadu_ps(at);
        };
        for (; n + 4 <= N; n += 4) {
          const __m128 scale = _mm_mul_ps(load4(a_scale), load4(b_scale));
          const __m128 x = _mm_mul_ps(_mm_loadu_ps(d + r * N + n), scale);
          const __m128 v = _mm_add_ps(_mm_div_ps(x, load4(y_scale)), load4(y_zero_point));
          const __m128i code = encode4(v, f);
          const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(code, code), _mm_setzero_si128());
          const int32_t four = _mm_cvtsi128_si32(bytes);
          std::memcpy(out + r * N + n, &four, 4);
        }
      }
#endif
      for (; n < N; ++n) {
        const float scale = a_scale.at(b, m, n) * b_scale.at(b, m, n);
        const float x = d[r * N + n] * scale;
        const float v = x / y_scale.at(b, m, n) + y_zero_point.at(b, m, n);
        out[r * N + n] = encode(v, f);
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
