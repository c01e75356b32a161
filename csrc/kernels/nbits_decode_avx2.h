// nbits_decode_avx2.h: MatMulNBits weight-code decoding on AVX2, shared by the float and int8 kernel files.
//
// Codes arrive in ONNX Runtime's layout: one LSB-first bitstream of k_blocks * block_size codes per
// output column (NBitsWeight::codes, row_bytes per column). Two kinds of decoding live here:
//
//  - in memory, a column at a time: 2, 3, 5, 6 and 7-bit codes to one byte each by pdep (BMI2, 8
//    codes per `bits` bytes, four independent pdeps per iteration; by shifts and masks where pdep
//    is microcode, AMD before Zen 3), 3-bit codes transcoded to the 4-bit layout (16 codes per pdep
//    into nibbles) so that the 4-bit kernels take them, and 4-bit codes split into nibbles with SIMD;
//  - in registers, 32 codes at a time straight from the packed column, unpacked to bytes for
//    level 4's vpmaddubsw (codes32_*). The 4-bit and 2-bit unpackers produce the codes in an order
//    cheaper than the natural one ([even | odd], quarters); level 4's int8 A is reordered to match
//    once per call (quarters_order, even_odd_qa).
//
// Everything is in an anonymous namespace (see nbits_avx2_common.h). The portable decoders
// decode_nbits / decode_nbits_range (matmul_nbits.cpp) finish what would read past a row.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu_features.h"
#include "matmul_nbits.h"
#include "nbits_avx2_common.h"

namespace qmm {
namespace {

// ---------------------------------------------------------------------------------------------
// In memory: one column's codes as one byte each (or as nibbles).

// The low 64 / field codes of `bits` bits of window, each in its own field of `field` bits (8:
// bytes, 4: nibbles) from the lowest: pdep(window, the fields' low `bits` bits) by shifts and masks,
// for CPUs whose pdep is microcode (cpu_features.h, pdep_fast).
template <int Field>
inline uint64_t deposit_by_shifts(uint64_t window, int bits) {
  const uint64_t m = (uint64_t{1} << bits) - 1;
  uint64_t out = 0;
  for (int i = 0; i < 64 / Field; ++i) out |= ((window >> (bits * i)) & m) << (Field * i);
  return out;
}

// out[8g .. 8g+7] = the 8 bytes at row + g * stride with their 64 / Field codes of `bits` bits
// deposited into fields of Field bits (pdep with mask, or the same by shifts where pdep is slow:
// pdep_preferred()) for the groups g < groups whose 8-byte window stays inside the row
// (row_bytes), four independent deposits per iteration; returns how many groups that was (the
// caller finishes the rest without over-reading).
template <int Field>
inline int64_t deposit_groups(const uint8_t* __restrict row, int64_t stride, int64_t row_bytes, int bits,
                              int64_t groups, uint8_t* __restrict out) {
  const int64_t safe = min_i64(groups, row_bytes >= 8 ? (row_bytes - 8) / stride + 1 : 0);
  uint64_t mask = 0;  // each field's low `bits` bits
  for (int i = 0; i < 64 / Field; ++i) mask |= ((uint64_t{1} << bits) - 1) << (Field * i);
  if (!pdep_preferred()) {
    for (int64_t g = 0; g < safe; ++g) {
      uint64_t window;
      std::memcpy(&window, row + g * stride, 8);
      const uint64_t deposited = deposit_by_shifts<Field>(window, bits);
      std::memcpy(out + 8 * g, &deposited, 8);
    }
    return safe;
  }
  auto group = [&](int64_t g) {
    uint64_t window;
    std::memcpy(&window, row + g * stride, 8);  // little-endian: code 0 in the lowest bits
    const uint64_t deposited = _pdep_u64(window, mask);
    std::memcpy(out + 8 * g, &deposited, 8);
  };
  int64_t g = 0;
  for (; g + 4 <= safe; g += 4) {
    group(g);
    group(g + 1);
    group(g + 2);
    group(g + 3);
  }
  for (; g < safe; ++g) group(g);
  return safe;
}

// Codes of 2, 3, 5, 6 or 7 bits to one byte each: every 8 codes fill exactly `bits` bytes, and one
// pdep (BMI2) deposits their 8 * bits bits into the low bits of 8 bytes. Each window is one
// unaligned 8-byte load while that stays inside the row (row_bytes); decode_nbits_range does the rest.
inline void decode_nbits_avx2(const uint8_t* __restrict row, int64_t bits, int64_t count, int64_t row_bytes,
                              uint8_t* __restrict out) {
  const int64_t g = deposit_groups<8>(row, bits, row_bytes, static_cast<int>(bits), count / 8, out);
  decode_nbits_range(row, bits, 8 * g, count - 8 * g, out + 8 * g);
}

// 2-bit codes k < count (a multiple of 32) as one byte each: byte j holds codes 4j .. 4j+3 in its
// bit pairs 0-1, 2-3, 4-5, 6-7; the four pairs masked out of 16 bytes, then interleaved back to
// code order by two rounds of unpacks (64 codes per 16 bytes; a last 32 from 8 bytes).
inline void decode_2bit(const uint8_t* __restrict row, int64_t count, uint8_t* __restrict out) {
  const __m128i mask = _mm_set1_epi8(3);
  auto quarters = [&](__m128i x, __m128i q[4]) {
    q[0] = _mm_and_si128(x, mask);
    q[1] = _mm_and_si128(_mm_srli_epi16(x, 2), mask);
    q[2] = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
    q[3] = _mm_and_si128(_mm_srli_epi16(x, 6), mask);
  };
  int64_t k = 0;
  for (; k + 64 <= count; k += 64) {
    __m128i q[4];
    quarters(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 4)), q);
    const __m128i a0 = _mm_unpacklo_epi8(q[0], q[1]), b0 = _mm_unpacklo_epi8(q[2], q[3]);  // bytes 0-7
    const __m128i a1 = _mm_unpackhi_epi8(q[0], q[1]), b1 = _mm_unpackhi_epi8(q[2], q[3]);  // bytes 8-15
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_unpacklo_epi16(a0, b0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 16), _mm_unpackhi_epi16(a0, b0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 32), _mm_unpacklo_epi16(a1, b1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 48), _mm_unpackhi_epi16(a1, b1));
  }
  if (k < count) {  // 32 codes: 8 bytes
    __m128i q[4];
    quarters(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 4)), q);
    const __m128i a0 = _mm_unpacklo_epi8(q[0], q[1]), b0 = _mm_unpacklo_epi8(q[2], q[3]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_unpacklo_epi16(a0, b0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 16), _mm_unpackhi_epi16(a0, b0));
  }
}

// Column n's codes k < count (a multiple of 32) as one byte each: 4-bit rows split into nibbles
// and 2-bit rows into bit pairs with SIMD, other widths through decode_nbits_avx2.
inline void decode_column(const NBitsWeight& w, int64_t n, int64_t count, uint8_t* out) {
  const uint8_t* row = w.codes + n * w.row_bytes;
  if (w.bits == 2) return decode_2bit(row, count, out);
  if (w.bits != 4) return decode_nbits_avx2(row, w.bits, count, w.row_bytes, out);
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int64_t k = 0; k < count; k += 32) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i lo = _mm_and_si128(x, mask), hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 16), _mm_unpackhi_epi8(lo, hi));
  }
}

// All k_blocks * block_size codes of column n as bytes, then zeros up to the next multiple of 32
// (out holds that many).
inline void decode_padded_column(const NBitsWeight& w, int64_t n, uint8_t* out) {
  const int64_t padded = w.k_blocks * w.block_size;
  if (padded % 32 == 0) return decode_column(w, n, padded, out);
  // block size 16 with an odd block count: the last 16 codes one by one
  decode_column(w, n, padded - 16, out);
  decode_nbits_range(w.codes + n * w.row_bytes, w.bits, padded - 16, 16, out + padded - 16);
  std::memset(out + padded, 0, 16);
}

// 3-bit codes to the 4-bit layout (two codes per byte, low nibble first), so that the 4-bit kernels
// take them: 16 codes (6 bytes) per pdep into 16 nibbles, half the pdeps of decoding to bytes.
// count is a multiple of 16 (k_blocks * block_size); windows that would read past the row go
// through decode_nbits_range.
inline void transcode_3bit_to_4bit(const uint8_t* __restrict row, int64_t count, int64_t row_bytes,
                                   uint8_t* __restrict out) {
  const int64_t groups = count / 16;
  int64_t g = deposit_groups<4>(row, 6, row_bytes, 3, groups, out);
  for (; g < groups; ++g) {
    uint8_t codes[16];
    decode_nbits_range(row, 3, 16 * g, 16, codes);
    for (int i = 0; i < 8; ++i) out[8 * g + i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

// ---------------------------------------------------------------------------------------------
// In registers, for the int8 kernels (level 4): 32 codes as 32 bytes for vpmaddubsw, and the int8
// A in the matching order.

// Codes k0 .. k0+31 held one byte per code (8-bit rows, and rows decoded to bytes beforehand).
inline __m256i codes32_bytes(const uint8_t* row, int64_t k0) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k0));
}

// 4-bit codes without interleaving: 16 packed bytes hold the even codes of 32 in their low nibbles
// and the odd ones in their high nibbles, so [low nibbles | high nibbles] is one broadcast, one
// variable shift and one mask; the int8 A is reordered to match once per call (even_odd_qa).
inline __m256i codes32_even_odd(const uint8_t* row, int64_t k0) {
  const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0 / 2)));
  return _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), _mm256_set1_epi8(0x0F));
}

// x[k0 .. k0+31] (int8 A) in the quarters order: out[8p + j] = x[4j + p].
template <typename T>
inline void quarters_order(const T* x, T* out) {
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 8; ++j) out[8 * p + j] = x[4 * j + p];
}

// 2-bit codes k0 .. k0+31 in the quarters order (codes 4j + p at byte 8p + j), as 32 bytes.
inline __m256i codes32_quarters(const uint8_t* row, int64_t k0) {
  const __m256i x = _mm256_broadcastq_epi64(  // one vpbroadcastq from memory
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 2))));
  return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 2, 4, 6)), _mm256_set1_epi8(3));
}

// qa[k0 .. k0+31] reordered to [the 16 even | the 16 odd], for every 32 of every row.
// With blocks of 16 (block_dot16), each 16 to [the 8 even | the 8 odd] instead.
inline void even_odd_qa(const int8_t* qa, int64_t count, int8_t* out, bool per16) {
  const __m256i within_lanes = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                                12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t k = 0; k < count; k += 32) {
    const __m256i x = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + k)), within_lanes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k),
                        per16 ? x : _mm256_permute4x64_epi64(x, 0xD8));  // lanes 0, 2, 1, 3
  }
}

}  // namespace
}  // namespace qmm
