// conv_depthwise_avx512.cpp: 2-D depthwise convolutions on AVX-512 VNNI (32 channels a step, two taps per vpdpwssd; conv_depthwise.inc's kernel), picked at run time by conv.cpp.
//
// Built in the avx512_vnni build (natively and over SIMDe, QMM_EMULATED, for the tests).
#include "avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "conv.h"

namespace qmm {
namespace {

// 512-bit vectors: 32 channels' int16 a step, lo / hi 16 int32 each.
struct V {
  using I = __m512i;
  using F = __m512;
  static constexpr int kBlock = 32;

  // 32 bytes of x widened to int16: `count` (1-32) of them from p, the rest 0 (never read past p +
  // count); Full: count is 32.
  template <bool Signed, bool Full>
  static I widened(const uint8_t* p, int count) {
    __m256i bytes;
    if (Full) {
      bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    } else {
#if defined(QMM_EMULATED)  // (SIMDe has no masked byte loads)
      alignas(32) uint8_t buffer[kBlock] = {};
      std::memcpy(buffer, p, static_cast<size_t>(count));
      bytes = _mm256_load_si256(reinterpret_cast<const __m256i*>(buffer));
#else
      bytes = _mm256_maskz_loadu_epi8(static_cast<__mmask32>((uint64_t{1} << count) - 1), p);
#endif
    }
#if defined(QMM_EMULATED)  // (SIMDe lacks _mm512_cvtepu8_epi16)
    const I words = _mm512_cvtepi8_epi16(bytes);
    return Signed ? words : _mm512_and_si512(words, _mm512_set1_epi16(0xFF));
#else
    return Signed ? _mm512_cvtepi8_epi16(bytes) : _mm512_cvtepu8_epi16(bytes);
#endif
  }
  static I unpack_lo(I a, I b) { return _mm512_unpacklo_epi16(a, b); }
  static I unpack_hi(I a, I b) { return _mm512_unpackhi_epi16(a, b); }
  // acc + each lane's pair of int16 products (vpdpwssd: no saturation), wrapping
  static I dot(I acc, I a, I w) { return _mm512_dpwssd_epi32(acc, a, w); }

  // count (1-32) int16 from p, the rest 0.
  static I load_words(const int16_t* p, int count) {
    if (count == kBlock) return _mm512_loadu_si512(p);
    alignas(64) int16_t buffer[kBlock] = {};
    std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(int16_t));
    return _mm512_load_si512(buffer);
  }
  // count (at most 16: none where count <= 0) 4-byte values from p, the rest 0.
  static I load_ints(const void* p, int count) {
    if (count >= 16) return _mm512_loadu_si512(p);
    alignas(64) int32_t buffer[16] = {};
    if (count > 0) std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(int32_t));
    return _mm512_load_si512(buffer);
  }
  // count (at most 16) int32 of `from` to p.
  static void store_ints(int32_t* p, I from, int count) {
    if (count >= 16) {
      _mm512_storeu_si512(p, from);
      return;
    }
    if (count <= 0) return;
    alignas(64) int32_t buffer[16];
    _mm512_store_si512(buffer, from);
    std::memcpy(p, buffer, static_cast<size_t>(count) * sizeof(int32_t));
  }

  // channels 0-15 and 16-31 in order -> lo's lanes (0-3, 8-11, 16-19, 24-27) and hi's
  static void to_halves(I first, I second, I& lo, I& hi) {
    lo = _mm512_permutex2var_epi32(first, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
                                   second);
    hi = _mm512_permutex2var_epi32(first, _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31),
                                   second);
  }
  // the reverse: channels 0-15 from lo / hi's lanes 0-7, 16-31 from 8-15
  static void from_halves(I lo, I hi, I& first, I& second) {
    first =
        _mm512_permutex2var_epi32(lo, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), hi);
    second = _mm512_permutex2var_epi32(
        lo, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), hi);
  }

  // The low bytes of 16 lanes holding values of the output's type.
  static __m128i low_bytes(I q, bool y_signed) {
#if defined(QMM_EMULATED)  // SIMDe lacks _mm512_cvtepi32_epi8: through int16
    const __m256i words = _mm512_cvtsepi32_epi16(q);
    const __m128i w0 = _mm256_castsi256_si128(words), w1 = _mm256_extracti128_si256(words, 1);
    return y_signed ? _mm_packs_epi16(w0, w1) : _mm_packus_epi16(w0, w1);
#else
    (void)y_signed;
    return _mm512_cvtepi32_epi8(q);
#endif
  }
  // lo / hi's outputs (values of the output's type) as `count` (1-32) bytes in channel order at p
  static void store_bytes(uint8_t* p, I q_lo, I q_hi, bool y_signed, int count) {
    const __m128i lo = low_bytes(q_lo, y_signed), hi = low_bytes(q_hi, y_signed);  // 4-byte groups alternate
    const __m256i bytes = _mm256_setr_m128i(_mm_unpacklo_epi32(lo, hi), _mm_unpackhi_epi32(lo, hi));
    if (count == kBlock) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bytes);
      return;
    }
    alignas(32) uint8_t buffer[kBlock];
    _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), bytes);
    std::memcpy(p, buffer, static_cast<size_t>(count));
  }

  static I zero() { return _mm512_setzero_si512(); }
  static I set1_epi16(int16_t v) { return _mm512_set1_epi16(v); }
  static I set1_epi32(int32_t v) { return _mm512_set1_epi32(v); }
  static I add_epi32(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub_epi32(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I mullo_epi32(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static F set1_ps(float v) { return _mm512_set1_ps(v); }
  static F as_ps(I v) { return _mm512_castsi512_ps(v); }
  static F cvtepi32_ps(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul_ps(F a, F b) { return _mm512_mul_ps(a, b); }
  static F clamp(F v, F lo, F hi) { return _mm512_min_ps(_mm512_max_ps(v, lo), hi); }
  static I cvtps_epi32(F v) { return _mm512_cvtps_epi32(v); }
};

}  // namespace

#include "conv_depthwise.inc"

}  // namespace qmm
