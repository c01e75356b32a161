// conv_depthwise_avx2.cpp: 2-D depthwise convolutions on AVX2 (16 channels a step, two taps per vpmaddwd; conv_depthwise.inc's kernel), picked at run time by conv.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "conv.h"

namespace qmm {
namespace {

// 256-bit vectors: 16 channels' int16 a step, lo / hi 8 int32 each.
struct V {
  using I = __m256i;
  using F = __m256;
  static constexpr int kBlock = 16;

  // 16 bytes of x widened to int16: `count` (1-16) of them from p, the rest 0 (never read past p +
  // count); Full: count is 16.
  template <bool Signed, bool Full>
  static I widened(const uint8_t* p, int count) {
    __m128i bytes;
    if (Full) {
      bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      alignas(16) uint8_t buffer[kBlock] = {};
      std::memcpy(buffer, p, static_cast<size_t>(count));
      bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(buffer));
    }
    return Signed ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
  }
  static I unpack_lo(I a, I b) { return _mm256_unpacklo_epi16(a, b); }
  static I unpack_hi(I a, I b) { return _mm256_unpackhi_epi16(a, b); }
  // acc + each lane's pair of int16 products (vpmaddwd: the pair's sum is exact here), wrapping
  static I dot(I acc, I a, I w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, w)); }

  // count (1-16) int16 from p, the rest 0.
  static I load_words(const int16_t* p, int count) {
    if (count == kBlock) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    alignas(32) int16_t buffer[kBlock] = {};
    std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(int16_t));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(buffer));
  }
  // count (at most 8: none where count <= 0) 4-byte values from p, the rest 0.
  static I load_ints(const void* p, int count) {
    if (count >= 8) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
    alignas(32) int32_t buffer[8] = {};
    if (count > 0) std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(int32_t));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(buffer));
  }
  // count (at most 8) int32 of `from` to p.
  static void store_ints(int32_t* p, I from, int count) {
    if (count >= 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), from);
      return;
    }
    if (count <= 0) return;
    alignas(32) int32_t buffer[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), from);
    std::memcpy(p, buffer, static_cast<size_t>(count) * sizeof(int32_t));
  }

  // channels 0-7 and 8-15 in order -> lo's lanes (0-3, 8-11) and hi's (4-7, 12-15)
  static void to_halves(I first, I second, I& lo, I& hi) {
    lo = _mm256_permute2x128_si256(first, second, 0x20);
    hi = _mm256_permute2x128_si256(first, second, 0x31);
  }
  // the reverse: channels 0-7 from lo / hi's low 128-bit halves, 8-15 from the high ones
  static void from_halves(I lo, I hi, I& first, I& second) {
    first = _mm256_permute2x128_si256(lo, hi, 0x20);
    second = _mm256_permute2x128_si256(lo, hi, 0x31);
  }

  // lo / hi's outputs (values of the output's type) as `count` (1-16) bytes in channel order at p:
  // packing lo with hi puts the 4-channel groups in order (int16), packing again to bytes leaves
  // channels 0-7 and 8-15 in the two 128-bit halves' low quadwords.
  static void store_bytes(uint8_t* p, I q_lo, I q_hi, bool y_signed, int count) {
    const __m256i words = _mm256_packs_epi32(q_lo, q_hi);
    const __m256i bytes = y_signed ? _mm256_packs_epi16(words, words) : _mm256_packus_epi16(words, words);
    const __m128i ordered = _mm256_castsi256_si128(_mm256_permute4x64_epi64(bytes, 0x08));
    if (count == kBlock) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ordered);
      return;
    }
    alignas(16) uint8_t buffer[kBlock];
    _mm_store_si128(reinterpret_cast<__m128i*>(buffer), ordered);
    std::memcpy(p, buffer, static_cast<size_t>(count));
  }

  static I zero() { return _mm256_setzero_si256(); }
  static I set1_epi16(int16_t v) { return _mm256_set1_epi16(v); }
  static I set1_epi32(int32_t v) { return _mm256_set1_epi32(v); }
  static I add_epi32(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub_epi32(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I mullo_epi32(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static F set1_ps(float v) { return _mm256_set1_ps(v); }
  static F as_ps(I v) { return _mm256_castsi256_ps(v); }
  static F cvtepi32_ps(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul_ps(F a, F b) { return _mm256_mul_ps(a, b); }
  static F clamp(F v, F lo, F hi) { return _mm256_min_ps(_mm256_max_ps(v, lo), hi); }
  static I cvtps_epi32(F v) { return _mm256_cvtps_epi32(v); }
};

}  // namespace

#include "conv_depthwise.inc"

}  // namespace qmm
