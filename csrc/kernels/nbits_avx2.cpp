// nbits_avx2.cpp: AVX2 MatMulNBits kernels: code decoding, level 0/1 float32 products (decode and prefill), level 4 int8 block dot products.
#include "nbits_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace qmm {
#include "fma_tile_avx2.inc"

namespace {
// MatMulNBits level 0/1, factored by block (docs/matmul_nbits.md, error bound of any order):
//   y[m, n] = sum_b scale[n, b] * (sum_{k in b} a[m, k] * q[n, k] - zero_point[n, b] * asum[m, b])
// with asum[m, b] = sum_{k in b} a[m, k] computed once per call. The codes of a block are widened
// to float32 once and reused by every row of A; each row keeps an 8-lane running sum, scaled per
// block with one FMA, and one horizontal sum per output.
//
//   4-bit codes: 16 bytes -> low and high nibbles -> 32 codes in order -> 4 x 8 floats
//   8-bit codes: 4 x 8 bytes widened directly; other widths go through decode_nbits.

// Codes of 2, 3, 5, 6 or 7 bits to one byte each: every 8 codes fill exactly `bits` bytes, and one
// pdep (BMI2) deposits their 8 * bits bits into the low bits of 8 bytes. The window is read as one
// unaligned 8-byte load while that stays inside the row (row_bytes), else byte by byte.
// out[8g .. 8g+7] = pdep(the 8 bytes at row + g * stride, mask) for the groups g < groups whose
// 8-byte window stays inside the row (row_bytes), four independent pdeps per iteration; returns
// how many groups that was (the caller finishes the rest without over-reading).
inline int64_t deposit_groups(const uint8_t* __restrict row, int64_t stride, int64_t row_bytes, uint64_t mask,
                              int64_t groups, uint8_t* __restrict out) {
  const int64_t safe = std::min(groups, row_bytes >= 8 ? (row_bytes - 8) / stride + 1 : 0);
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

inline void decode_nbits_avx2(const uint8_t* __restrict row, int64_t bits, int64_t count, int64_t row_bytes,
                              uint8_t* __restrict out) {
  const uint64_t mask = 0x0101010101010101ull * ((1ull << bits) - 1);
  const int64_t g = deposit_groups(row, bits, row_bytes, mask, count / 8, out);
  decode_nbits_range(row, bits, 8 * g, count - 8 * g, out + 8 * g);
}

// Column n's codes k < count (a multiple of 32) as one byte each: 4-bit rows split into nibbles
// with SIMD, other widths through decode_nbits_avx2.
inline void decode_column(const NBitsWeight& w, int64_t n, int64_t count, uint8_t* out) {
  const uint8_t* row = w.codes + n * w.row_bytes;
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

// The zero points of blocks index .. index+7 (index = n * k_blocks + b) as float32.
inline __m256 zero_points8(const NBitsWeight& w, int64_t index) {
  if (!w.zero_points_u8) return _mm256_loadu_ps(w.zero_points + index);
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zero_points_u8 + index))));
}

// 3-bit codes to the 4-bit layout (two codes per byte, low nibble first), so that the 4-bit kernels
// take them: 16 codes (6 bytes) per pdep into 16 nibbles, half the pdeps of decoding to bytes.
// count is a multiple of 16 (k_blocks * block_size); windows that would read past the row go
// through decode_nbits_range.
inline void transcode_3bit_to_4bit(const uint8_t* __restrict row, int64_t count, int64_t row_bytes,
                                   uint8_t* __restrict out) {
  const int64_t groups = count / 16;
  int64_t g = deposit_groups(row, 6, row_bytes, 0x7777777777777777ull, groups, out);
  for (; g < groups; ++g) {
    uint8_t codes[16];
    decode_nbits_range(row, 3, 16 * g, 16, codes);
    for (int i = 0; i < 8; ++i) out[8 * g + i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

// The codes k0 .. k0+31 of a column held one byte per code (8-bit rows, and rows of other widths
// decoded beforehand) as 4 x 8 floats, in order.
inline void widen32(const uint8_t* codes, int64_t k0, __m256 out[4]) {
  for (int i = 0; i < 4; ++i) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k0 + 8 * i));
    out[i] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
  }
}

float horizontal_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// 4-bit codes k0 .. k0+31 as floats in the order [even codes 0..14 | even 16..30 | odd 1..15 |
// odd 17..31]: one broadcast load, two masks, four in-lane byte shuffles into dwords, four
// conversions (no cross-lane widening). A is reordered to match (even_odd_a).
inline void widen32_even_odd(const uint8_t* row, int64_t k0, __m256 out[4]) {
  const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 1))));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i even = _mm256_and_si256(x, mask), odd = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
  constexpr char z = static_cast<char>(0x80);
  const __m256i first = _mm256_setr_epi8(0, z, z, z, 1, z, z, z, 2, z, z, z, 3, z, z, z,   // bytes 0..3 | 4..7
                                         4, z, z, z, 5, z, z, z, 6, z, z, z, 7, z, z, z);
  const __m256i second = _mm256_setr_epi8(8, z, z, z, 9, z, z, z, 10, z, z, z, 11, z, z, z,  // 8..11 | 12..15
                                          12, z, z, z, 13, z, z, z, 14, z, z, z, 15, z, z, z);
  out[0] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(even, first));
  out[1] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(even, second));
  out[2] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(odd, first));
  out[3] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(odd, second));
}

// 2-bit codes k0 .. k0+31 (8 bytes, 4 codes each) as floats by quarters: out[p] holds the codes
// k0 + 4j + p, j = 0..7 (two variable shifts and masks, four widenings; A reordered to match,
// quarters_order).
inline __m128i quarters_bytes(const uint8_t* row, int64_t k0, int p0) {  // [quarter p0 | quarter p0 + 1]
  const __m128i x = _mm_broadcastq_epi64(  // one vpbroadcastq from memory
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 2))));
  return _mm_and_si128(_mm_srlv_epi64(x, _mm_set_epi64x(2 * p0 + 2, 2 * p0)), _mm_set1_epi8(3));
}

inline void widen32_quarters(const uint8_t* row, int64_t k0, __m256 out[4]) {
  const __m128i q01 = quarters_bytes(row, k0, 0), q23 = quarters_bytes(row, k0, 2);
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q01));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q01, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q23));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q23, 8)));
}

// x[k0 .. k0+31] (floats or int8) in the quarters order: out[8p + j] = x[4j + p].
template <typename T>
inline void quarters_order(const T* x, T* out) {
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 8; ++j) out[8 * p + j] = x[4 * j + p];
}

// Blocks of 16: codes k0 .. k0+15 as floats, 4-bit ones in the order [8 even | 8 odd] (A is
// reordered to match, even_odd_a16), bytes in order.
inline void widen16(const uint8_t* row, int64_t k0, bool nibbles, __m256 out[2]) {
  __m128i c;
  if (nibbles) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 1)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    c = _mm_unpacklo_epi64(_mm_and_si128(x, mask), _mm_and_si128(_mm_srli_epi16(x, 4), mask));
  } else {
    c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0));
  }
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c, 8)));
}

inline void even_odd_a16(const float* a, float* out) {
  for (int j = 0; j < 8; ++j) {
    out[j] = a[2 * j];
    out[8 + j] = a[2 * j + 1];
  }
}

// a[k0 .. k0+31] reordered to [a0 a2 .. a14 | a16 .. a30 | a1 a3 .. a15 | a17 .. a31].
inline void even_odd_a(const float* a, float* out) {
  const __m256 v0 = _mm256_loadu_ps(a), v1 = _mm256_loadu_ps(a + 8);
  const __m256 v2 = _mm256_loadu_ps(a + 16), v3 = _mm256_loadu_ps(a + 24);
  auto ordered = [](__m256 x) {  // 64-bit granules 0, 2, 1, 3
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(x), 0xD8));
  };
  _mm256_storeu_ps(out, ordered(_mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0))));
  _mm256_storeu_ps(out + 8, ordered(_mm256_shuffle_ps(v2, v3, _MM_SHUFFLE(2, 0, 2, 0))));
  _mm256_storeu_ps(out + 16, ordered(_mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1))));
  _mm256_storeu_ps(out + 24, ordered(_mm256_shuffle_ps(v2, v3, _MM_SHUFFLE(3, 1, 3, 1))));
}

// Few rows of A (decode): the factored form, codes widened straight from the packed weight, MR
// running sums in registers.
template <int MR, int Kind>  // Kind: 4 = nibbles, 2 = 2-bit quarters (blocks of 32+), 0 = bytes
void nbits_rows_factored(const float* A, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t K = w.K, bs = w.block_size, kb = w.k_blocks;
  thread_local std::vector<float> asum;
  thread_local std::vector<uint8_t> codes;
  asum.resize(static_cast<size_t>(MR * kb));
  codes.resize(static_cast<size_t>(std::max(K + 32, w.k_blocks * w.block_size)));  // bytes, or the 3-bit column as nibbles
  for (int m = 0; m < MR; ++m)
    for (int64_t b = 0; b < kb; ++b) {
      float sum = 0.0f;
      for (int64_t k = b * bs; k < std::min(K, (b + 1) * bs); ++k) sum += A[m * K + k];
      asum[m * kb + b] = sum;
    }
  constexpr bool nibbles = Kind == 4, quarters = Kind == 2;
  const bool bytes = w.bits == 8;
  const int64_t whole_blocks = K / bs;        // blocks with all block_size codes (a multiple of 32)
  // 4-bit: A's whole blocks reordered once per task to the order widen32_even_odd produces.
  thread_local std::vector<float> reordered;
  const float* a_main = A;
  if (nibbles) {
    reordered.resize(static_cast<size_t>(MR * K));
    for (int m = 0; m < MR; ++m)
      for (int64_t k = 0; k < whole_blocks * bs; k += 32) {
        if (bs == 16) {  // per 16: [8 even | 8 odd], as widen16 produces
          even_odd_a16(A + m * K + k, reordered.data() + m * K + k);
          if (k + 16 < whole_blocks * bs) even_odd_a16(A + m * K + k + 16, reordered.data() + m * K + k + 16);
        } else {
          even_odd_a(A + m * K + k, reordered.data() + m * K + k);
        }
      }
    a_main = reordered.data();
  }
  if (quarters) {  // 2-bit: to the order widen32_quarters produces
    reordered.resize(static_cast<size_t>(MR * K));
    for (int m = 0; m < MR; ++m)
      for (int64_t k = 0; k < whole_blocks * bs; k += 32) quarters_order(A + m * K + k, reordered.data() + m * K + k);
    a_main = reordered.data();
  }
  // Plain pointers: thread_local storage is looked up again on every access the compiler cannot hoist.
  const float* const block_sums = asum.data();
  uint8_t* const decoded = codes.data();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes + n * w.row_bytes;
    if (nibbles && w.bits == 3) {  // 3-bit codes transcoded to the 4-bit layout first
      transcode_3bit_to_4bit(row, w.k_blocks * w.block_size, w.row_bytes, decoded);
      row = decoded;
    } else if (!nibbles && !quarters && !bytes) {  // 5, 6, 7 bits (2 with blocks of 16): one byte per code first
      decode_nbits_avx2(row, w.bits, K, w.row_bytes, decoded);
      row = decoded;
    }
    const float* scales = w.scales + n * kb;
    float correction[MR], tail[MR];
    for (int m = 0; m < MR; ++m) {  // sum_b zero_point * scale * asum, 8 blocks per FMA
      tail[m] = 0.0f;
      __m256 c8 = _mm256_setzero_ps();
      int64_t b = 0;
      for (; b + 8 <= kb; b += 8)
        c8 = _mm256_fmadd_ps(_mm256_mul_ps(zero_points8(w, n * kb + b), _mm256_loadu_ps(scales + b)),
                             _mm256_loadu_ps(block_sums + m * kb + b), c8);
      float c = horizontal_sum(c8);
      for (; b < kb; ++b) c += zero_point(w, n * kb + b) * scales[b] * block_sums[m * kb + b];
      correction[m] = c;
    }
    // Block b's sum per row, in independent chains (FMA latency, not throughput, would bound a
    // single one: 4 cycles per FMA); even and odd blocks then scale into separate accumulators,
    // for the same reason.
    constexpr int Chains = 2;  // 4 measured no faster at blocks of 128, slower at 32
    auto block = [&](int64_t b, __m256 acc[MR]) {
      const __m256 scale = _mm256_set1_ps(scales[b]);
      __m256 chain[MR][Chains];
      for (int m = 0; m < MR; ++m)
        for (int c = 0; c < Chains; ++c) chain[m][c] = _mm256_setzero_ps();
      if (bs == 16) {
        __m256 q[2];
        widen16(row, b * 16, nibbles, q);
        for (int m = 0; m < MR; ++m) {
          const float* a = a_main + m * K + b * 16;
          chain[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a), q[0], chain[m][0]);
          chain[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), q[1], chain[m][1]);
        }
      }
      for (int64_t k = b * bs; bs >= 32 && k < (b + 1) * bs; k += 32) {
        __m256 q[4];
        if (nibbles) widen32_even_odd(row, k, q);
        else if (quarters) widen32_quarters(row, k, q);
        else widen32(row, k, q);
        for (int m = 0; m < MR; ++m) {
          const float* a = a_main + m * K + k;
          for (int i = 0; i < 4; ++i)
            chain[m][i % Chains] = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8 * i), q[i], chain[m][i % Chains]);
        }
      }
      for (int m = 0; m < MR; ++m) {
        __m256 sum = _mm256_add_ps(chain[m][0], chain[m][1]);
        acc[m] = _mm256_fmadd_ps(sum, scale, acc[m]);
      }
    };
    __m256 acc[MR], acc_odd[MR];
    for (int m = 0; m < MR; ++m) acc[m] = acc_odd[m] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= whole_blocks; b += 2) {
      block(b, acc);
      block(b + 1, acc_odd);
    }
    if (b < whole_blocks) block(b, acc);
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_add_ps(acc[m], acc_odd[m]);
    if (whole_blocks < kb) {  // K's last, partial block
      const int64_t k0 = whole_blocks * bs;
      uint8_t rest_codes[1024];
      for (int64_t k = k0; k < K; k += 1024) {
        const int64_t count = std::min<int64_t>(1024, K - k);
        decode_nbits_range(row, nibbles ? 4 : quarters ? 2 : 8, k, count, rest_codes);
        for (int m = 0; m < MR; ++m) {
          float dot = 0.0f;
          for (int64_t j = 0; j < count; ++j) dot += A[m * K + k + j] * static_cast<float>(rest_codes[j]);
          tail[m] += dot * scales[whole_blocks];
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      const float y = horizontal_sum(acc[m]) + tail[m] - correction[m];
      Y[m * w.N + n] = bias ? y + bias[n] : y;
    }
  }
}

// Many rows of A (prefill): the task's (up to) 16 columns dequantized exactly as dequantize_nbits
// does into a float32 panel [K][16] (column by column, then 8 x 8 transposes), then register tiles
// over k-chunks of 256 (16 KB of panel: L1-resident while every row tile passes). Partial sums live
// in a [M][16] float32 block.
//
// Rows come in groups of kRowGroup, interleaved by k once per call (nbits_prepare_f32_avx2:
// [k][6] per group, so that a tile's broadcasts read one run per k instead of 6 rows K floats
// apart, which share L1 sets): per k, two loads of the panel, six broadcasts, twelve FMAs into
// 12 accumulators. The last M % 6 rows stay in order and take 4 x 16 and 1 x 16 tiles.
constexpr int64_t kRowGroup = 6;
constexpr int64_t kFactoredMaxRows = 12;  // up to this many rows, the factored kernel (measured crossover)

// x[0 .. count) rounded to float16 or bfloat16 and back, 8 at a time (round_operand's results).
inline void round_operands(float* x, int64_t count, NBitsOperands operands) {
  int64_t k = 0;
  if (operands == NBitsOperands::kFloat16) {
    for (; k + 8 <= count; k += 8)  // F16C: nearest even, overflow to infinity, NaN kept
      _mm256_storeu_ps(x + k, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + k), _MM_FROUND_TO_NEAREST_INT)));
  } else {
    const __m256i round = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i keep = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (; k + 8 <= count; k += 8) {
      const __m256 v = _mm256_loadu_ps(x + k);
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
      const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(bits, round), lsb), keep));
      _mm256_storeu_ps(x + k, _mm256_blendv_ps(rounded, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));  // NaN kept
    }
  }
  for (; k < count; ++k) x[k] = round_operand(x[k], operands);
}

// wrow[k] = float32(q[k] - zero_point[block]) * scale[block] for k < K, 8 at a time: the same two
// roundings, in the same order, as dequantize_column (nbits_dequantize.inc) and dequantize_nbits;
// then rounded to w.operands (levels 2 and 3).
inline void dequantize_column_avx2(const NBitsWeight& w, int64_t n, uint8_t* codes, float* wrow) {
  decode_padded_column(w, n, codes);
  const float* scales = w.scales + n * w.k_blocks;
  if (w.g_idx) {  // each code its own block's scale and zero point
    for (int64_t k = 0; k < w.K; ++k)
      wrow[k] = (static_cast<float>(codes[k]) - zero_point(w, n * w.k_blocks + w.g_idx[k])) * scales[w.g_idx[k]];
  }
  for (int64_t b = 0; !w.g_idx && b < w.k_blocks; ++b) {
    const int64_t k0 = b * w.block_size, k1 = std::min(w.K, k0 + w.block_size);
    const float zero_point_b = zero_point(w, n * w.k_blocks + b);
    const __m256 scale = _mm256_set1_ps(scales[b]), zp = _mm256_set1_ps(zero_point_b);
    int64_t k = k0;
    for (; k + 8 <= k1; k += 8) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k)));
      _mm256_storeu_ps(wrow + k, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), zp), scale));
    }
    for (; k < k1; ++k) wrow[k] = (static_cast<float>(codes[k]) - zero_point_b) * scales[b];
  }
  if (w.operands != NBitsOperands::kFloat32) round_operands(wrow, w.K, w.operands);
}

// rows[c][k .. k+7] for 8 columns c into panel[k .. k+7][8 columns] (row stride 16 floats).
inline void transpose_8x8(const float* const rows[8], int64_t k, float* panel) {
  __m256 r[8];
  for (int c = 0; c < 8; ++c) r[c] = _mm256_loadu_ps(rows[c] + k);
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 out[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                         _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                         _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                         _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (k + i) * 16, out[i]);
}

void nbits_rows_dequantized(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1,
                            const float* bias, float* Y) {
  const int64_t K = w.K, K8 = (K + 7) / 8 * 8;
  thread_local std::vector<uint8_t> codes_storage;
  thread_local std::vector<float> columns_storage, panel_storage, partial_storage;
  constexpr int64_t kChunk = 256;
  codes_storage.resize(static_cast<size_t>((w.k_blocks * w.block_size + 31) / 32 * 32));
  columns_storage.resize(static_cast<size_t>(16 * K8));
  panel_storage.resize(static_cast<size_t>(K8 * 16));
  partial_storage.resize(static_cast<size_t>(M * 16));
  // Plain pointers: thread_local storage is looked up again on every access the compiler cannot hoist.
  uint8_t* const codes = codes_storage.data();
  float* const columns = columns_storage.data();
  float* const panel = panel_storage.data();
  float* const partial = partial_storage.data();
  const bool grouped = M > kFactoredMaxRows;  // as nbits_prepare_f32_avx2 decided
  const int64_t groups = grouped ? M / kRowGroup : 0;
  for (int64_t n = n0; n < n1; n += 16) {
    const int64_t cols = std::min<int64_t>(16, n1 - n);
    for (int64_t c = 0; c < 16; ++c) {
      float* column = columns + c * K8;
      if (c < cols) {
        dequantize_column_avx2(w, n + c, codes, column);
        std::fill(column + K, column + K8, 0.0f);  // k past K
      } else {
        std::fill(column, column + K8, 0.0f);  // past N
      }
    }
    for (int half = 0; half < 2; ++half) {
      const float* rows[8];
      for (int c = 0; c < 8; ++c) rows[c] = columns + (8 * half + c) * K8;
      for (int64_t k = 0; k < K8; k += 8) transpose_8x8(rows, k, panel + 8 * half);
    }
    std::fill(partial, partial + M * 16, 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int64_t k1 = std::min(K, k0 + kChunk);
      for (int64_t g = 0; g < groups; ++g)
        fma_tile<kRowGroup>(A + g * kRowGroup * K, 1, kRowGroup, k0, k1, panel, partial + g * kRowGroup * 16);
      int64_t m = groups * kRowGroup;
      for (; m + 4 <= M; m += 4) fma_tile<4>(A + m * K, K, 1, k0, k1, panel, partial + m * 16);
      for (; m < M; ++m) fma_tile<1>(A + m * K, K, 1, k0, k1, panel, partial + m * 16);
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < cols; ++j)
        Y[m * w.N + n + j] = bias ? partial[m * 16 + j] + bias[n + j] : partial[m * 16 + j];
  }
}

// Few rows with a non-trivial g_idx: one column at a time dequantized (and rounded) into a float32
// row, then one dot product per row of A in four chains of 8 lanes.
void nbits_rows_columns(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                        float* Y) {
  const int64_t K = w.K;
  thread_local std::vector<uint8_t> codes_storage;
  thread_local std::vector<float> wrow_storage;
  codes_storage.resize(static_cast<size_t>((w.k_blocks * w.block_size + 31) / 32 * 32));
  wrow_storage.resize(static_cast<size_t>(K));
  uint8_t* const codes = codes_storage.data();
  float* const wrow = wrow_storage.data();
  for (int64_t n = n0; n < n1; ++n) {
    dequantize_column_avx2(w, n, codes, wrow);
    for (int64_t m = 0; m < M; ++m) {
      const float* a = A + m * K;
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      int64_t k = 0;
      for (; k + 32 <= K; k += 32)
        for (int i = 0; i < 4; ++i)
          acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8 * i), _mm256_loadu_ps(wrow + k + 8 * i), acc[i]);
      for (; k + 8 <= K; k += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(wrow + k), acc[0]);
      float y = horizontal_sum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
      for (; k < K; ++k) y += a[k] * wrow[k];
      Y[m * w.N + n] = bias ? y + bias[n] : y;
    }
  }
}

// 8 float32 values rounded to float16 or bfloat16 and back (round_operands, in registers).
inline __m256 round8(__m256 v, NBitsOperands operands) {
  if (operands == NBitsOperands::kFloat16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(sum, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  return _mm256_blendv_ps(rounded, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));  // NaN kept
}

// Levels 2 and 3 with few rows (MR <= 4): per column, the codes decoded to bytes (SIMD for 4-bit),
// then per 8 codes the weight float32(q - zp) * scale rounded in registers and multiplied into MR
// running sums; the last, partial 8 of each block and of K one by one.
template <int MR>
void nbits_rows_rounded(const float* A, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t K = w.K;
  thread_local std::vector<uint8_t> codes_storage;
  codes_storage.resize(static_cast<size_t>((w.k_blocks * w.block_size + 31) / 32 * 32));
  uint8_t* const codes = codes_storage.data();
  for (int64_t n = n0; n < n1; ++n) {
    decode_padded_column(w, n, codes);
    const float* scales = w.scales + n * w.k_blocks;
    __m256 acc[MR];
    float tail[MR];
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm256_setzero_ps();
      tail[m] = 0.0f;
    }
    for (int64_t b = 0; b < w.k_blocks; ++b) {
      const int64_t k0 = b * w.block_size, k1 = std::min(K, k0 + w.block_size);
      const float scale_b = scales[b], zp_b = zero_point(w, n * w.k_blocks + b);
      const __m256 scale = _mm256_set1_ps(scale_b), zp = _mm256_set1_ps(zp_b);
      int64_t k = k0;
      for (; k + 8 <= k1; k += 8) {
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k)));
        const __m256 wv = round8(_mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), zp), scale), w.operands);
        for (int m = 0; m < MR; ++m) acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(A + m * K + k), wv, acc[m]);
      }
      for (; k < k1; ++k) {
        const float wk = round_operand((static_cast<float>(codes[k]) - zp_b) * scale_b, w.operands);
        for (int m = 0; m < MR; ++m) tail[m] += A[m * K + k] * wk;
      }
    }
    for (int m = 0; m < MR; ++m) {
      const float y = horizontal_sum(acc[m]) + tail[m];
      Y[m * w.N + n] = bias ? y + bias[n] : y;
    }
  }
}

// Level 0/1 with more than kFactoredMaxRows rows: every whole group of kRowGroup rows of A
// interleaved by k ([k][row]) into out, the last M % kRowGroup rows copied in order after them.
bool nbits_prepare_f32_avx2(const float* A, int64_t M, int64_t K, float* out) {
  if (M <= kFactoredMaxRows) return false;
  int64_t m = 0;
  for (; m + kRowGroup <= M; m += kRowGroup)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t r = 0; r < kRowGroup; ++r) out[m * K + k * kRowGroup + r] = A[(m + r) * K + k];
  std::memcpy(out + m * K, A + m * K, static_cast<size_t>((M - m) * K) * sizeof(float));
  return true;
}

// MatMulNBits level 4: per 32 codes, one exact integer dot product with the int8 A.
//   codes <= 127 (2..7 bits): vpmaddubsw (u8 code x s8 qa, pairs <= 2 * 127 * 128 < 2^15: no
//   saturation), then vpmaddwd with ones into 8 int32; 8-bit codes: both widened to int16, vpmaddwd.
// A block's int32 sum is converted once and scaled by scale_a * scale_b into an 8-lane float sum.
inline __m256i codes32_bytes(const uint8_t* row, int64_t k0) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k0));
}

inline __m256i dot32(__m256i codes, const int8_t* qa, bool wide_codes) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa));
  if (!wide_codes) return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), _mm256_set1_epi16(1));
  const __m256i c_lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(codes));
  const __m256i c_hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(codes, 1));
  const __m256i a_lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a));
  const __m256i a_hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1));
  return _mm256_add_epi32(_mm256_madd_epi16(c_lo, a_lo), _mm256_madd_epi16(c_hi, a_hi));
}

// The 8 int32 partial sums of each of d[0..7] added up: one int32 per vector, in order.
inline __m256i reduce8(const __m256i d[8]) {
  const __m256i t0 = _mm256_hadd_epi32(d[0], d[1]), t1 = _mm256_hadd_epi32(d[2], d[3]);
  const __m256i t2 = _mm256_hadd_epi32(d[4], d[5]), t3 = _mm256_hadd_epi32(d[6], d[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

// 4-bit codes without interleaving: 16 packed bytes hold the even codes of 32 in their low nibbles
// and the odd ones in their high nibbles, so [low nibbles | high nibbles] is one broadcast, one
// variable shift and one mask; the int8 A is reordered to match once per call (even_odd_qa).
inline __m256i codes32_even_odd(const uint8_t* row, int64_t k0) {
  const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0 / 2)));
  return _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), _mm256_set1_epi8(0x0F));
}

// 2-bit codes k0 .. k0+31 in the quarters order of widen32_quarters, as 32 bytes.
inline __m256i codes32_quarters(const uint8_t* row, int64_t k0) {
  const __m256i x = _mm256_broadcastq_epi64(  // one vpbroadcastq from memory
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 2))));
  return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 2, 4, 6)), _mm256_set1_epi8(3));
}

// qa[k0 .. k0+31] reordered to [the 16 even | the 16 odd], for every 32 of every row.
// With blocks of 16 (codes16_even_odd), each 16 to [the 8 even | the 8 odd] instead.
void even_odd_qa(const int8_t* qa, int64_t count, int8_t* out, bool per16) {
  const __m256i within_lanes = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                                0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t k = 0; k < count; k += 32) {
    const __m256i x = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + k)), within_lanes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), per16 ? x : _mm256_permute4x64_epi64(x, 0xD8));  // lanes 0, 2, 1, 3
  }
}

// Blocks of 16 codes, in 128-bit halves: the int32 dot product of the codes k0 .. k0+15 with qa
// (4-bit codes: [8 even | 8 odd] like codes32_even_odd; bytes otherwise), in the low 4 lanes.
template <int Kind>
inline __m256i block_dot16(const uint8_t* row, const int8_t* qa, int64_t k0) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qa + k0));
  if (Kind == 8) {
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0)));
    return _mm256_madd_epi16(c, _mm256_cvtepi8_epi16(a));
  }
  __m128i codes;
  if (Kind == 4) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 1)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    codes = _mm_unpacklo_epi64(_mm_and_si128(x, mask), _mm_and_si128(_mm_srli_epi16(x, 4), mask));
  } else {
    codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0));
  }
  const __m128i dot = _mm_madd_epi16(_mm_maddubs_epi16(codes, a), _mm_set1_epi16(1));
  return _mm256_inserti128_si256(_mm256_setzero_si256(), dot, 0);
}

// The int32 dot product of one block (Chunks x 32 codes, Chunks a compile-time count when the
// block size is known, else `chunks`) of one column with the int8 A. Kind: 4 = nibbles ([even |
// odd] order), 8 = 8-bit codes (int16 pairs), 0 = one byte per code of at most 7 bits.
// Codes of up to 7 bits add `steps` chunks of vpmaddubsw pair sums in int16 before one vpmaddwd
// widens them (int16_steps: 8 for 4-bit codes, so one widening per block up to 256 codes).
constexpr int64_t int16_steps(int64_t bits) { return 32767 / (254 * ((int64_t{1} << bits) - 1)); }

template <int Kind, int Chunks, int MR>
inline void block_dots(const uint8_t* row, const int8_t* const qa[MR], int64_t k0, int64_t chunks, int64_t steps,
                       __m256i dot[MR]) {
  if constexpr (Chunks < 0) {  // a block of 16 codes
    for (int m = 0; m < MR; ++m) dot[m] = block_dot16<Kind>(row, qa[m], k0);
    return;
  }
  for (int m = 0; m < MR; ++m) dot[m] = _mm256_setzero_si256();
  const int64_t n = Chunks ? Chunks : chunks;
  if (Kind == 8) {
    for (int64_t c = 0; c < n; ++c) {
      const __m256i codes = codes32_bytes(row, k0 + 32 * c);
      for (int m = 0; m < MR; ++m) dot[m] = _mm256_add_epi32(dot[m], dot32(codes, qa[m] + k0 + 32 * c, true));
    }
    return;
  }
  // Chunks c0 .. c1-1 summed in int16, then widened into dot.
  auto segment = [&](int64_t c0, int64_t c1) {
    __m256i sum16[MR];
    for (int m = 0; m < MR; ++m) sum16[m] = _mm256_setzero_si256();
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t k = k0 + 32 * c;
      const __m256i codes = Kind == 4   ? codes32_even_odd(row, k)
                            : Kind == 2 ? codes32_quarters(row, k)
                                        : codes32_bytes(row, k);
      for (int m = 0; m < MR; ++m) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa[m] + k));
        sum16[m] = _mm256_add_epi16(sum16[m], _mm256_maddubs_epi16(codes, a));
      }
    }
    for (int m = 0; m < MR; ++m) dot[m] = _mm256_add_epi32(dot[m], _mm256_madd_epi16(sum16[m], _mm256_set1_epi16(1)));
  };
  const int64_t step = Kind == 4 ? int16_steps(4) : Kind == 2 ? int16_steps(2) : steps;
  if (Chunks > 0 && Chunks <= step) return segment(0, Chunks);  // one segment, a compile-time trip count
  for (int64_t c0 = 0; c0 < n; c0 += step) segment(c0, std::min(n, c0 + step));
}

// MR rows (m0 ...) of A against columns [n0, n1): each chunk of codes is loaded and unpacked once
// for all MR rows.
template <int Kind, int Chunks, int MR>
void nbits_rows_int8_impl(const QuantizedA& a, int64_t m0, const NBitsWeight& w, int64_t n0, int64_t n1,
                          const float* bias, float* Y, const uint8_t* (*column)(const NBitsWeight&, int64_t, uint8_t*)) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, chunks = bs / 32, steps = int16_steps(w.bits);
  thread_local std::vector<uint8_t> codes_storage;
  codes_storage.resize(static_cast<size_t>(padded));
  uint8_t* const codes = codes_storage.data();
  const int8_t* qa[MR];
  for (int m = 0; m < MR; ++m) qa[m] = a.qa + (m0 + m) * padded;
  const float* scale_a = a.scale + m0 * kb;
  const float* block_sum = a.block_sum + m0 * kb;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = column(w, n, codes);
    const float* scales = w.scales + n * kb;
    // Eight blocks at a time: their int32 dot products reduced into one vector per row, scaled by
    // scale_a * scale_b lane by lane; the zero-point term likewise.
    __m256 acc[MR], correction[MR];
    for (int m = 0; m < MR; ++m) acc[m] = correction[m] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= kb; b += 8) {
      __m256i dots[MR][8];
      for (int i = 0; i < 8; ++i) {
        __m256i dot[MR];
        block_dots<Kind, Chunks, MR>(row, qa, (b + i) * bs, chunks, steps, dot);
        for (int m = 0; m < MR; ++m) dots[m][i] = dot[m];
      }
      const __m256 sb = _mm256_loadu_ps(scales + b), szp = _mm256_mul_ps(sb, zero_points8(w, n * kb + b));
      for (int m = 0; m < MR; ++m) {
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(dots[m])), _mm256_mul_ps(_mm256_loadu_ps(scale_a + m * kb + b), sb),
                                 acc[m]);
        correction[m] = _mm256_fmadd_ps(_mm256_loadu_ps(block_sum + m * kb + b), szp, correction[m]);
      }
    }
    float y[MR];
    for (int m = 0; m < MR; ++m) y[m] = horizontal_sum(acc[m]) - horizontal_sum(correction[m]);
    for (; b < kb; ++b) {
      __m256i dot[MR];
      block_dots<Kind, Chunks, MR>(row, qa, b * bs, chunks, steps, dot);
      for (int m = 0; m < MR; ++m) {
        const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(dot[m]), _mm256_extracti128_si256(dot[m], 1));
        const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        const int32_t total = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
        y[m] += scale_a[m * kb + b] * scales[b] * static_cast<float>(total) -
                block_sum[m * kb + b] * (scales[b] * zero_point(w, n * kb + b));
      }
    }
    for (int m = 0; m < MR; ++m) Y[(m0 + m) * w.N + n] = bias ? y[m] + bias[n] : y[m];
  }
}

template <int Kind, int Chunks>
void nbits_rows_int8_rows(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                          float* Y, const uint8_t* (*column)(const NBitsWeight&, int64_t, uint8_t*)) {
  for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
    switch (std::min<int64_t>(4, a.M - m0)) {
      case 1: nbits_rows_int8_impl<Kind, Chunks, 1>(a, m0, w, n0, n1, bias, Y, column); break;
      case 2: nbits_rows_int8_impl<Kind, Chunks, 2>(a, m0, w, n0, n1, bias, Y, column); break;
      case 3: nbits_rows_int8_impl<Kind, Chunks, 3>(a, m0, w, n0, n1, bias, Y, column); break;
      default: nbits_rows_int8_impl<Kind, Chunks, 4>(a, m0, w, n0, n1, bias, Y, column);
    }
  }
}

// Column n's codes as the kernels read them: in place for 4 and 8 bits, else decoded to bytes
// (padded codes meet qa = 0, whatever they hold).
const uint8_t* column_in_place(const NBitsWeight& w, int64_t n, uint8_t*) { return w.codes + n * w.row_bytes; }
// 3-bit codes as 4-bit ones (the 4-bit kernel then reads them).
const uint8_t* column_transcoded(const NBitsWeight& w, int64_t n, uint8_t* out) {
  transcode_3bit_to_4bit(w.codes + n * w.row_bytes, w.k_blocks * w.block_size, w.row_bytes, out);
  return out;
}
const uint8_t* column_decoded(const NBitsWeight& w, int64_t n, uint8_t* out) {
  decode_nbits_avx2(w.codes + n * w.row_bytes, w.bits, w.k_blocks * w.block_size, w.row_bytes, out);
  return out;
}

template <int Kind>
void nbits_rows_int8_kind(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                          float* Y) {
  const auto column = Kind == 0 ? column_decoded : Kind == 4 && w.bits == 3 ? column_transcoded : column_in_place;
  switch (w.block_size) {  // the usual block sizes with compile-time loop counts
    case 16: return nbits_rows_int8_rows<Kind, -1>(a, w, n0, n1, bias, Y, column);
    case 32: return nbits_rows_int8_rows<Kind, 1>(a, w, n0, n1, bias, Y, column);
    case 64: return nbits_rows_int8_rows<Kind, 2>(a, w, n0, n1, bias, Y, column);
    case 128: return nbits_rows_int8_rows<Kind, 4>(a, w, n0, n1, bias, Y, column);
    case 256: return nbits_rows_int8_rows<Kind, 8>(a, w, n0, n1, bias, Y, column);
    default: return nbits_rows_int8_rows<Kind, 0>(a, w, n0, n1, bias, Y, column);
  }
}

// Level 4 with many rows of A (prefill): a register-tiled int8 GEMM over each task's 16 columns.
//
// The task's codes are decoded once to one byte each and laid out by quads of k:
//   panel[q][c][j] = code of column c at k = 4q + j        (64 bytes per quad: 16 columns x 4)
// so that one 32-byte load holds 8 columns x 4 codes, and one broadcast of 4 int8 of a row of A
// meets them in vpmaddubsw (u8 code x s8 qa, adjacent pairs added into int16).
//
// A pair sum is at most 2 * 127 * qmax (|qa| <= 127, qmax = 2^bits - 1), so `steps` =
// floor(32767 / (254 * qmax)) of them add up in int16 without overflow (8 for 4-bit codes, 43 for
// 2-bit, 1 for 7-bit); then one vpmaddwd with ones widens to int32, and the block's int32 sum is
// exact. The block then enters float32 as the per-row formula does: acc += D * (sa * sb) and
// acc -= block_sum_a * (sb * zp). 8-bit codes (u8 x s8 pairs up to 64770) take the signed form of
// int8_segment_signed, with the codes and the zero point both shifted by -128.
//
// Per quad of k, a 4 x 16 tile does 2 loads of codes, 4 broadcasts of A, 8 vpmaddubsw and 8 int16
// adds for 256 multiply-adds: the widening, conversion and scaling run once per `steps` quads.
constexpr int64_t kInt8GemmMinRows = 8;  // below it the per-row kernel (codes unpacked once per 4 rows) wins

// The int16 sums of quads [q0, q1) of the tile, widened to int32 with vpmaddwd: out[r][v] for
// rows r < MR and the two 8-column vectors v of the panel.
template <int MR>
inline void int8_segment(const int8_t* a, int64_t row_stride, int64_t quad_stride, const uint8_t* p, int64_t q0,
                         int64_t q1, __m256i out[MR][2]) {
  __m256i sum16[MR][2];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 2; ++v) sum16[r][v] = _mm256_setzero_si256();
  for (int64_t q = q0; q < q1; ++q) {
    __m256i c[2];
    for (int v = 0; v < 2; ++v) c[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64 + 32 * v));
    for (int r = 0; r < MR; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * row_stride + q * quad_stride, 4);
      const __m256i av = _mm256_set1_epi32(four);
      for (int v = 0; v < 2; ++v) sum16[r][v] = _mm256_add_epi16(sum16[r][v], _mm256_maddubs_epi16(c[v], av));
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 2; ++v) out[r][v] = _mm256_madd_epi16(sum16[r][v], ones);
}

// The 4 x 16 tile over quads [q0, q1) of 4 grouped rows ([quad][row][4] int8, nbits_prepare_int8_avx2),
// its 8 int16 sums pinned to registers: written with intrinsics, GCC keeps one of them on the stack
// and the loop then waits on store-to-load forwarding every quad (measured: 1.4x slower).
inline void int8_segment_4x16(const int8_t* a, const uint8_t* p, int64_t q0, int64_t q1, __m256i out[4][2]) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  const uint8_t* codes = p + q0 * 64;
  const int8_t* rows = a + q0 * 16;
  int64_t n = q1 - q0;
  // AT&T order: vpmaddubsw signed, unsigned, destination.
  __asm__(
      "1:\n\t"
      "vmovdqu (%[codes]), %%ymm8\n\t"
      "vmovdqu 32(%[codes]), %%ymm9\n\t"
      "vpbroadcastd (%[rows]), %%ymm10\n\t"
      "vpbroadcastd 4(%[rows]), %%ymm11\n\t"
      "vpmaddubsw %%ymm10, %%ymm8, %%ymm12\n\t"
      "vpmaddubsw %%ymm10, %%ymm9, %%ymm13\n\t"
      "vpmaddubsw %%ymm11, %%ymm8, %%ymm14\n\t"
      "vpmaddubsw %%ymm11, %%ymm9, %%ymm15\n\t"
      "vpaddw %%ymm12, %[s0], %[s0]\n\t"
      "vpaddw %%ymm13, %[s1], %[s1]\n\t"
      "vpaddw %%ymm14, %[s2], %[s2]\n\t"
      "vpaddw %%ymm15, %[s3], %[s3]\n\t"
      "vpbroadcastd 8(%[rows]), %%ymm10\n\t"
      "vpbroadcastd 12(%[rows]), %%ymm11\n\t"
      "vpmaddubsw %%ymm10, %%ymm8, %%ymm12\n\t"
      "vpmaddubsw %%ymm10, %%ymm9, %%ymm13\n\t"
      "vpmaddubsw %%ymm11, %%ymm8, %%ymm14\n\t"
      "vpmaddubsw %%ymm11, %%ymm9, %%ymm15\n\t"
      "vpaddw %%ymm12, %[s4], %[s4]\n\t"
      "vpaddw %%ymm13, %[s5], %[s5]\n\t"
      "vpaddw %%ymm14, %[s6], %[s6]\n\t"
      "vpaddw %%ymm15, %[s7], %[s7]\n\t"
      "add $64, %[codes]\n\t"
      "add $16, %[rows]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4), [s5] "+x"(s5), [s6] "+x"(s6),
        [s7] "+x"(s7), [codes] "+r"(codes), [rows] "+r"(rows), [n] "+r"(n)
      :
      : "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i sums[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < 2; ++v) out[r][v] = _mm256_madd_epi16(sums[2 * r + v], ones);
}

// 8-bit codes, held in the panel as c - 128 (int8): sum qa * (c - 128) per column, exact in int32.
// vpmaddubsw takes |c - 128| (at most 128, unsigned) and qa with the sign of c - 128 (vpsignb; qa
// is never -128), so a pair sums to at most 2 * 128 * 127 < 2^15; each quad is widened at once.
template <int MR>
inline void int8_segment_signed(const int8_t* a, int64_t row_stride, int64_t quad_stride, const uint8_t* p, int64_t q0,
                                int64_t q1, __m256i out[MR][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) out[r][0] = out[r][1] = _mm256_setzero_si256();
  for (int64_t q = q0; q < q1; ++q) {
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64));
    const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64 + 32));
    const __m256i m0 = _mm256_abs_epi8(c0), m1 = _mm256_abs_epi8(c1);
    for (int r = 0; r < MR; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * row_stride + q * quad_stride, 4);
      const __m256i av = _mm256_set1_epi32(four);
      out[r][0] = _mm256_add_epi32(out[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(m0, _mm256_sign_epi8(av, c0)), ones));
      out[r][1] = _mm256_add_epi32(out[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(m1, _mm256_sign_epi8(av, c1)), ones));
    }
  }
}

template <int MR, bool Signed8>
inline void int8_segment_tile(const int8_t* a, int64_t row_stride, int64_t quad_stride, const uint8_t* p, int64_t q0,
                              int64_t q1, __m256i out[MR][2]) {
  if constexpr (Signed8) int8_segment_signed<MR>(a, row_stride, quad_stride, p, q0, q1, out);
  else if constexpr (MR == 4) int8_segment_4x16(a, p, q0, q1, out);  // grouped rows: row_stride 4, quad_stride 16
  else int8_segment<MR>(a, row_stride, quad_stride, p, q0, q1, out);
}

// Blocks [b0, b1) of rows [0, MR) of the tile into acc ([MR][16] float32). A block of more than
// `steps` quads adds its segments' int32 sums in `dot`, kept in memory: the 2 * MR int16 sums
// already take 2 * MR of the 16 ymm registers (int32 sums in registers too spill worse, and a
// 4 x 8 tile that has room for them measured slower).
template <int MR, bool Signed8>
void int8_gemm_tile(const int8_t* qa, int64_t row_stride, int64_t quad_stride, const float* sa, const float* bsum, int64_t kb,
                    const uint8_t* panel, const float* sb, const float* szb, int64_t b0, int64_t b1,
                    int64_t quads_per_block, int64_t steps, float* acc, int32_t* dot) {
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* p = panel + b * quads_per_block * 64;
    const int8_t* a = qa + b * quads_per_block * quad_stride;
    __m256i sum[MR][2];
    int8_segment_tile<MR, Signed8>(a, row_stride, quad_stride, p, 0, std::min(steps, quads_per_block), sum);
    if (steps < quads_per_block) {
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < 2; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(dot + r * 16 + 8 * v), sum[r][v]);
      for (int64_t q0 = steps; q0 < quads_per_block; q0 += steps) {
        int8_segment_tile<MR, Signed8>(a, row_stride, quad_stride, p, q0, std::min(quads_per_block, q0 + steps), sum);
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < 2; ++v) {
            auto* d = reinterpret_cast<__m256i*>(dot + r * 16 + 8 * v);
            _mm256_store_si256(d, _mm256_add_epi32(_mm256_load_si256(d), sum[r][v]));
          }
        __asm__ volatile("" : : "r"(dot) : "memory");  // dot stays in memory
      }
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < 2; ++v) sum[r][v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(dot + r * 16 + 8 * v));
    }
    for (int r = 0; r < MR; ++r) {
      const __m256 scale_a = _mm256_set1_ps(sa[r * kb + b]), block_sum = _mm256_set1_ps(bsum[r * kb + b]);
      for (int v = 0; v < 2; ++v) {
        float* out = acc + r * 16 + 8 * v;
        __m256 f = _mm256_loadu_ps(out);
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][v]), _mm256_mul_ps(scale_a, _mm256_loadu_ps(sb + b * 16 + 8 * v)), f);
        f = _mm256_fnmadd_ps(block_sum, _mm256_loadu_ps(szb + b * 16 + 8 * v), f);
        _mm256_storeu_ps(out, f);
      }
    }
  }
}

// 8 columns x 32 codes (rows[c] + k) into the panel's quads q = k/4 .. k/4+7 (8 dwords each
// side): an 8 x 8 transpose of 32-bit elements.
inline void transpose_8x32(const uint8_t* const rows[8], int64_t k, uint8_t* panel_half) {
  __m256i r[8];
  for (int c = 0; c < 8; ++c) r[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c] + k));
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  // u0: quad 0 of columns 0-3 | quad 4 of columns 0-3 (lanes), u4 the same for columns 4-7, ...
  const __m256i quads[8] = {
      _mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
      _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
      _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
      _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31)};
  for (int q = 0; q < 8; ++q)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel_half + (k / 4 + q) * 64), quads[q]);
}

void nbits_int8_gemm(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, M = a.M, cols = n1 - n0;
  const bool signed8 = w.bits == 8;
  const int64_t decoded_len = (padded + 31) / 32 * 32;  // whole 32s for the transpose; the extra codes meet no A
  thread_local std::vector<uint8_t> panel_storage, columns_storage;
  thread_local std::vector<float> sb_storage, szb_storage, acc_storage;
  panel_storage.resize(static_cast<size_t>(decoded_len / 4 * 64));
  columns_storage.resize(static_cast<size_t>(16 * decoded_len));
  sb_storage.assign(static_cast<size_t>(kb * 16), 0.0f);
  szb_storage.assign(static_cast<size_t>(kb * 16), 0.0f);
  acc_storage.assign(static_cast<size_t>(M * 16), 0.0f);
  // Plain pointers: thread_local storage is looked up on every access the compiler cannot hoist.
  uint8_t* const panel = panel_storage.data();
  uint8_t* const columns = columns_storage.data();
  float* const sb = sb_storage.data();
  float* const szb = szb_storage.data();
  float* const acc = acc_storage.data();
  for (int64_t c = 0; c < 16; ++c) {
    uint8_t* column = columns + c * decoded_len;
    if (c >= cols) {  // past N: codes 0 (their scales are 0 too)
      std::memset(column, 0, static_cast<size_t>(decoded_len));
      continue;
    }
    const int64_t n = n0 + c;
    decode_padded_column(w, n, column);
    if (signed8)  // c - 128, and the zero point likewise: (c - 128) - (zp - 128) = c - zp
      for (int64_t k = 0; k < padded; ++k) column[k] ^= 0x80;
    for (int64_t b = 0; b < kb; ++b) {
      sb[b * 16 + c] = w.scales[n * kb + b];
      szb[b * 16 + c] = w.scales[n * kb + b] * (zero_point(w, n * kb + b) - (signed8 ? 128.0f : 0.0f));
    }
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* rows[8];
    for (int c = 0; c < 8; ++c) rows[c] = columns + (8 * half + c) * decoded_len;
    for (int64_t k = 0; k < decoded_len; k += 32) transpose_8x32(rows, k, panel + 32 * half);
  }
  const int64_t quads_per_block = bs / 4, steps = signed8 ? quads_per_block : int16_steps(w.bits);
  const int64_t chunk = std::max<int64_t>(1, 256 / bs);  // blocks per pass: 16 KB of codes at most stay in L1
  alignas(32) int32_t dot[4 * 16];
  for (int64_t b0 = 0; b0 < kb; b0 += chunk) {
    const int64_t b1 = std::min(kb, b0 + chunk);
    int64_t m = 0;
    auto tile = [&](auto rows) {
      constexpr int MR = decltype(rows)::value;
      // Whole groups of 4 rows come interleaved by quads (nbits_prepare_int8_avx2), the rest in order.
      const bool grouped = MR == 4;
      const int8_t* qa = a.qa + m * padded;
      const int64_t row_stride = grouped ? 4 : padded, quad_stride = grouped ? 16 : 4;
      const float *sa = a.scale + m * kb, *bsum = a.block_sum + m * kb;
      if (signed8)
        int8_gemm_tile<MR, true>(qa, row_stride, quad_stride, sa, bsum, kb, panel, sb, szb, b0, b1, quads_per_block,
                                 steps, acc + m * 16, dot);
      else
        int8_gemm_tile<MR, false>(qa, row_stride, quad_stride, sa, bsum, kb, panel, sb, szb, b0, b1, quads_per_block,
                                  steps, acc + m * 16, dot);
      m += MR;
    };
    while (m + 4 <= M) tile(std::integral_constant<int, 4>{});
    if (M - m == 3) tile(std::integral_constant<int, 3>{});
    if (M - m == 2) tile(std::integral_constant<int, 2>{});
    if (M - m == 1) tile(std::integral_constant<int, 1>{});
  }
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = n0; n < n1; ++n) {
      const float y = acc[r * 16 + (n - n0)];
      Y[r * w.N + n] = bias ? y + bias[n] : y;
    }
}

void nbits_rows_int8_avx2(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                          float* Y) {
  if (a.M >= kInt8GemmMinRows) return nbits_int8_gemm(a, w, n0, n1, bias, Y);
  if (w.bits == 8) return nbits_rows_int8_kind<8>(a, w, n0, n1, bias, Y);
  if (w.bits == 3) return nbits_rows_int8_kind<4>(a, w, n0, n1, bias, Y);  // as 4-bit codes, qa as for 4-bit
  if (w.bits == 2 && w.block_size >= 32) return nbits_rows_int8_kind<2>(a, w, n0, n1, bias, Y);  // qa in quarters order
  if (w.bits != 4) return nbits_rows_int8_kind<0>(a, w, n0, n1, bias, Y);
  nbits_rows_int8_kind<4>(a, w, n0, n1, bias, Y);  // A in [even | odd] order: nbits_prepare_int8_avx2
}

// Level 4's int8 A, rearranged once per call for the kernel that will read it:
//  - the GEMM (kInt8GemmMinRows+ rows): every whole group of 4 rows interleaved by quads of k,
//    [quad][row][4], so that a tile's broadcasts read one 16-byte run per quad (rows 4096 bytes
//    apart would also share L1 sets); the last M % 4 rows stay in order;
//  - the per-row 4-bit kernel: each 32 to the [even | odd] order of codes32_even_odd (each 16
//    with blocks of 16, for block_dot16); the 2-bit one (blocks of 32+): each 32 to the quarters
//    order of codes32_quarters.
void nbits_prepare_int8_avx2(int8_t* qa, int64_t M, const NBitsWeight& w) {
  const int64_t padded = w.k_blocks * w.block_size;
  if (M >= kInt8GemmMinRows) {
    std::vector<int8_t> group(static_cast<size_t>(4 * padded));
    for (int64_t g = 0; g + 4 <= M; g += 4) {
      int8_t* rows = qa + g * padded;
      std::memcpy(group.data(), rows, group.size());
      for (int64_t q = 0; q < padded / 4; ++q)
        for (int r = 0; r < 4; ++r) std::memcpy(rows + q * 16 + r * 4, group.data() + r * padded + q * 4, 4);
    }
    return;
  }
  if (w.bits == 2 && w.block_size >= 32) {
    std::vector<int8_t> natural(qa, qa + M * padded);
    for (int64_t k = 0; k < M * padded; k += 32) quarters_order(natural.data() + k, qa + k);
    return;
  }
  if (w.bits != 4 && w.bits != 3) return;  // 3-bit codes reach the 4-bit kernel transcoded
  const int64_t count = M * padded;  // a multiple of 32 except with blocks of 16 and k_blocks odd
  std::vector<int8_t> natural(qa, qa + count);
  even_odd_qa(natural.data(), count / 32 * 32, qa, w.block_size == 16);
  if (count % 32) {  // the last 16
    alignas(16) int8_t last[32] = {};
    std::memcpy(last, natural.data() + count / 32 * 32, 16);
    even_odd_qa(last, 32, last, true);
    std::memcpy(qa + count / 32 * 32, last, 16);
  }
}

template <int MR>
void factored(const float* A, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  if (w.bits == 4 || w.bits == 3) nbits_rows_factored<MR, 4>(A, w, n0, n1, bias, Y);  // 3: transcoded
  else if (w.bits == 2 && w.block_size >= 32) nbits_rows_factored<MR, 2>(A, w, n0, n1, bias, Y);
  else nbits_rows_factored<MR, 0>(A, w, n0, n1, bias, Y);
}

// Rows [0, M) in passes of up to 4 (one kernel instantiation per row count: registers).
template <template <int> class Kernel>
void in_row_passes(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                   float* Y) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const float* a = A + m0 * w.K;
    float* y = Y + m0 * w.N;
    switch (std::min<int64_t>(4, M - m0)) {
      case 1: Kernel<1>::run(a, w, n0, n1, bias, y); break;
      case 2: Kernel<2>::run(a, w, n0, n1, bias, y); break;
      case 3: Kernel<3>::run(a, w, n0, n1, bias, y); break;
      default: Kernel<4>::run(a, w, n0, n1, bias, y);
    }
  }
}

template <int MR>
struct Factored {
  static void run(const float* A, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
    factored<MR>(A, w, n0, n1, bias, Y);
  }
};

template <int MR>
struct Rounded {
  static void run(const float* A, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
    nbits_rows_rounded<MR>(A, w, n0, n1, bias, Y);
  }
};

void nbits_rows_avx2(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                     float* Y) {
  if (M > kFactoredMaxRows) return nbits_rows_dequantized(A, M, w, n0, n1, bias, Y);
  if (w.g_idx) return nbits_rows_columns(A, M, w, n0, n1, bias, Y);
  // Rounded operands (levels 2 and 3) do not factor by block: each column is dequantized and rounded first.
  if (w.operands != NBitsOperands::kFloat32) return in_row_passes<Rounded>(A, M, w, n0, n1, bias, Y);
  // Each pass unpacks the codes again, which up to kFactoredMaxRows rows costs less than
  // dequantizing the weights to float32 panels.
  in_row_passes<Factored>(A, M, w, n0, n1, bias, Y);
}
}  // namespace

namespace avx2 {

void nbits_rows(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  nbits_rows_avx2(A, M, w, n0, n1, bias, Y);
}
void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  nbits_rows_int8_avx2(a, w, n0, n1, bias, Y);
}
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w) { nbits_prepare_int8_avx2(qa, M, w); }
bool nbits_prepare_f32(const float* A, int64_t M, int64_t K, float* out) { return nbits_prepare_f32_avx2(A, M, K, out); }

}  // namespace avx2
}  // namespace qmm
