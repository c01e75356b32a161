// nbits_f32_avx2.cpp: AVX2 MatMulNBits float kernels, accuracy levels 0-3 (the table's nbits_rows).
//
// Y[:, n0:n1] for all M rows of A (float32 [M, K]), W[k, n] = float32(q - zero_point) * scale,
// products and sums in float32. nbits_rows picks, per task of columns:
//
//  - M <= 12, levels 0/1, no g_idx: the block-factored form on the "quads x16" layout, columns in
//    the lanes (nbits_packed_avx2.cpp: nbits_rows_packed), on MatMulNBits' packed weight or on
//    panels of that layout built per call from the codes;
//  - M <= 12, levels 2/3 (W rounded to float16 / bfloat16; A arrives rounded): nbits_rows_rounded,
//    dequantize, round and FMA fused per 8 codes, in passes of up to 4 rows;
//  - M <= 12 with a non-trivial g_idx (any level 0-3): nbits_rows_columns, one dequantized (and
//    rounded) column at a time, one dot product per row;
//  - M > 12 (prefill, any level 0-3, g_idx too): nbits_rows_dequantized, 16 columns dequantized
//    into a [K][16] float32 panel (from the packed weight where there is one:
//    nbits_dequantize_packed) and swept by 4..6 x 16 FMA tiles (fma_tile_avx2.inc) that read A in
//    place.
//
// Level 4 with a g_idx also lands here (the Python front end passes the dequantized int8 A).
// The codes are decoded by nbits_decode_avx2.h; docs/matmul_nbits.md bounds the error of any
// summation order these kernels use.
#include "nbits_avx2.h"

#include <immintrin.h>

#include <cstring>

#include "nbits_avx2_common.h"
#include "nbits_decode_avx2.h"

namespace qmm {
#include "fma_tile_avx2.inc"

namespace {
// Many rows of A (prefill): the task's (up to) 16 columns dequantized exactly as dequantize_nbits
// does (g_idx included; rounded to float16 / bfloat16 at levels 2/3) into a float32 panel [K][16]
// (dequantize_panel16: bytes transposed in registers; with a g_idx, column by column, then 8 x 8
// float transposes), then register tiles over k-chunks of 256 (16 KB of
// panel: L1-resident while every row tile passes). Partial sums live in a [M][16] float32 block.
//
// Rows come in ceil(M / 6) groups of 4 to 6 rows, as even as they go (RowGroups: M = 128 is 18
// groups of 6 and 4 of 5), read in place (row r, column k at A + r K + k): per k, two loads of
// the panel, one broadcast per row, two FMAs per row into 8 to 12 independent accumulators. (Until
// 2026-11-25 the last M % 6 rows took 4 x 16 and 1 x 16 tiles in row order: a 1-row tile is
// FMA-latency-bound, 2 rows of 128 took 3 % of the time. Until the thirteenth session each group
// was interleaved by k once per call, [k][rows], by a scalar loop on the calling thread: in place
// is as fast where that helped — six rows K floats apart stay within L1's eight ways even with K
// a multiple of 1024 — and saves it: 64x384x384 1.19x, 256x384x384 1.21x, 32x3072x768 1.08x,
// 512x4096x4096 even; the AVX2 table on Zen 4, 2 threads.)
constexpr int64_t kRowGroup = 6;  // rows per group at most
constexpr int64_t kFactoredMaxRows = 12;  // up to this many rows, the factored kernel (crossover measured in 2026-11)

// The row groups of M > kFactoredMaxRows rows: group g starts at row first(g) and has rows(g) rows.
struct RowGroups {
  int64_t count, base, extra;  // the first `extra` groups have base + 1 rows, the others base
  explicit RowGroups(int64_t M)
      : count((M + kRowGroup - 1) / kRowGroup), base(M / count), extra(M - M / count * count) {}
  int64_t first(int64_t g) const { return g * base + (g < extra ? g : extra); }
  int64_t rows(int64_t g) const { return base + (g < extra ? 1 : 0); }
};

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
      const __m256 rounded =
          _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(bits, round), lsb), keep));
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
    const int64_t k0 = b * w.block_size, k1 = min_i64(w.K, k0 + w.block_size);
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
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
               u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
               u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)),
               u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)),
               u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 out[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                         _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                         _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                         _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (k + i) * 16, out[i]);
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

// rows r[0 .. 7] = bytes k0 .. k0+7 of the 16 columns x[c] (8 bytes each): row k's byte c is x[c]'s
// byte k. Four rounds of unpacks (bytes, words, dwords, qwords).
inline void transpose_16x8_bytes(const __m128i x[16], __m128i r[8]) {
  __m128i t[8], u[4], v[4];
  for (int j = 0; j < 8; ++j) t[j] = _mm_unpacklo_epi8(x[2 * j], x[2 * j + 1]);  // k0..7: 2 columns
  for (int j = 0; j < 4; ++j) {
    u[j] = _mm_unpacklo_epi16(t[2 * j], t[2 * j + 1]);  // k0..3: 4 columns
    v[j] = _mm_unpackhi_epi16(t[2 * j], t[2 * j + 1]);  // k4..7
  }
  const __m128i p0 = _mm_unpacklo_epi32(u[0], u[1]), p1 = _mm_unpacklo_epi32(u[2], u[3]);  // k0, k1: 8 columns
  const __m128i q0 = _mm_unpackhi_epi32(u[0], u[1]), q1 = _mm_unpackhi_epi32(u[2], u[3]);  // k2, k3
  const __m128i p2 = _mm_unpacklo_epi32(v[0], v[1]), p3 = _mm_unpacklo_epi32(v[2], v[3]);  // k4, k5
  const __m128i q2 = _mm_unpackhi_epi32(v[0], v[1]), q3 = _mm_unpackhi_epi32(v[2], v[3]);  // k6, k7
  r[0] = _mm_unpacklo_epi64(p0, p1);
  r[1] = _mm_unpackhi_epi64(p0, p1);
  r[2] = _mm_unpacklo_epi64(q0, q1);
  r[3] = _mm_unpackhi_epi64(q0, q1);
  r[4] = _mm_unpacklo_epi64(p2, p3);
  r[5] = _mm_unpackhi_epi64(p2, p3);
  r[6] = _mm_unpacklo_epi64(q2, q3);
  r[7] = _mm_unpackhi_epi64(q2, q3);
}

// Without a g_idx: columns [n, n + cols) (cols <= 16; zeros past them) into panel [K8][16], each
// value float32(q - zero_point) * scale (rounded to w.operands at levels 2/3) as
// dequantize_column_avx2 computes it, rows past K zero. The codes are decoded per column to bytes
// (codes: 16 columns of `stride` bytes), then per 8 k the 16 columns' bytes are transposed in
// registers and each k's 16 codes dequantized with the block's zero points and scales of the 16
// columns as vectors: no float32 column buffer, no float transposes.
void dequantize_panel16(const NBitsWeight& w, int64_t n, int64_t cols, uint8_t* codes, int64_t stride, float* panel) {
  const int64_t K = w.K, K8 = (K + 7) / 8 * 8, kb = w.k_blocks, bs = w.block_size;
  for (int64_t c = 0; c < 16; ++c) {
    if (c < cols) decode_padded_column(w, n + c, codes + c * stride);
    else std::memset(codes + c * stride, 0, static_cast<size_t>(K8));
  }
  for (int64_t b = 0; b * bs < K8; ++b) {
    alignas(32) float zp[16], scale[16];
    for (int64_t c = 0; c < 16; ++c) {
      zp[c] = c < cols ? zero_point(w, (n + c) * kb + b) : 0.0f;
      scale[c] = c < cols ? w.scales[(n + c) * kb + b] : 0.0f;  // columns past N: (0 - 0) * 0
    }
    const __m256 zp0 = _mm256_load_ps(zp), zp1 = _mm256_load_ps(zp + 8);
    const __m256 scale0 = _mm256_load_ps(scale), scale1 = _mm256_load_ps(scale + 8);
    for (int64_t k0 = b * bs; k0 < min_i64(K8, (b + 1) * bs); k0 += 8) {
      __m128i x[16], r[8];
      for (int c = 0; c < 16; ++c) x[c] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + c * stride + k0));
      transpose_16x8_bytes(x, r);
      for (int i = 0; i < 8; ++i) {
        float* row = panel + (k0 + i) * 16;
        if (k0 + i >= K) {  // k past K
          _mm256_storeu_ps(row, _mm256_setzero_ps());
          _mm256_storeu_ps(row + 8, _mm256_setzero_ps());
          continue;
        }
        const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(r[i]));
        const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(r[i], 8)));
        __m256 v0 = _mm256_mul_ps(_mm256_sub_ps(q0, zp0), scale0), v1 = _mm256_mul_ps(_mm256_sub_ps(q1, zp1), scale1);
        if (w.operands != NBitsOperands::kFloat32) {
          v0 = round8(v0, w.operands);
          v1 = round8(v1, w.operands);
        }
        _mm256_storeu_ps(row, v0);
        _mm256_storeu_ps(row + 8, v1);
      }
    }
  }
}

void nbits_rows_dequantized(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                            float* Y) {
  const int64_t K = w.K, K8 = (K + 7) / 8 * 8;
  thread_local Scratch codes_storage, columns_storage, panel_storage, partial_storage;
  constexpr int64_t kChunk = 256;
  // Plain pointers: thread_local storage is looked up again on every access the compiler cannot hoist.
  const int64_t stride = (w.k_blocks * w.block_size + 16 + 31) / 32 * 32;  // decode_padded_column writes 16 past
  uint8_t* const codes = codes_storage.get<uint8_t>(w.g_idx ? stride : 16 * stride);
  float* const columns = columns_storage.get<float>(w.g_idx ? 16 * K8 : 0);
  float* const panel = panel_storage.get<float>(K8 * 16);
  float* const partial = partial_storage.get<float>(M * 16);
  const RowGroups groups(M);  // M > kFactoredMaxRows
  for (int64_t n = n0; n < n1; n += 16) {
    const int64_t cols = min_i64(16, n1 - n);
    if (w.packed) avx2::nbits_dequantize_packed(w, n, panel);  // levels 0/1 on MatMulNBits' packed weight
    else if (!w.g_idx) dequantize_panel16(w, n, cols, codes, stride, panel);
    for (int64_t c = 0; w.g_idx && c < 16; ++c) {
      float* column = columns + c * K8;
      if (c < cols) {
        dequantize_column_avx2(w, n + c, codes, column);
        zero_floats(column + K, K8 - K);  // k past K
      } else {
        zero_floats(column, K8);  // past N
      }
    }
    for (int half = 0; w.g_idx && half < 2; ++half) {
      const float* rows[8];
      for (int c = 0; c < 8; ++c) rows[c] = columns + (8 * half + c) * K8;
      for (int64_t k = 0; k < K8; k += 8) transpose_8x8(rows, k, panel + 8 * half);
    }
    zero_floats(partial, M * 16);
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int64_t k1 = min_i64(K, k0 + kChunk);
      for (int64_t g = 0; g < groups.count; ++g) {
        const int64_t m = groups.first(g), rows = groups.rows(g);
        if (rows == 6) fma_tile<6>(A + m * K, K, 1, k0, k1, panel, partial + m * 16);
        else if (rows == 5) fma_tile<5>(A + m * K, K, 1, k0, k1, panel, partial + m * 16);
        else fma_tile<4>(A + m * K, K, 1, k0, k1, panel, partial + m * 16);
      }
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
  thread_local Scratch codes_storage, wrow_storage;
  uint8_t* const codes = codes_storage.get<uint8_t>((w.k_blocks * w.block_size + 31) / 32 * 32);
  float* const wrow = wrow_storage.get<float>(K);
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

// The 16 values of t0 (codes 0-7) and t1 (codes 8-15), each exact in float16 (operands kFloat16)
// or bfloat16, as two byte tables for pshufb: the low bytes and the high bytes of their 16-bit
// patterns, in code order.
inline void half_tables(__m256 t0, __m256 t1, NBitsOperands operands, __m128i& low, __m128i& high) {
  __m256i halves;  // 16 x 16 bits, codes 0-15
  if (operands == NBitsOperands::kFloat16) {
    halves = _mm256_set_m128i(_mm256_cvtps_ph(t1, _MM_FROUND_TO_NEAREST_INT),
                              _mm256_cvtps_ph(t0, _MM_FROUND_TO_NEAREST_INT));
  } else {  // bfloat16: the high 16 bits; packus interleaves the lanes, the permute restores code order
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(t0), 16),
                                               _mm256_srli_epi32(_mm256_castps_si256(t1), 16));
    halves = _mm256_permute4x64_epi64(packed, 0xD8);
  }
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  // per lane: low
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);  // bytes, high bytes
  const __m256i bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(halves, split), 0xD8);
  low = _mm256_castsi256_si128(bytes);
  high = _mm256_extracti128_si256(bytes, 1);
}

// The float32 values of 8 16-bit patterns (float16 or bfloat16).
inline __m256 widen_halves(__m128i halves, NBitsOperands operands) {
  if (operands == NBitsOperands::kFloat16) return _mm256_cvtph_ps(halves);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

// Levels 2 and 3 with few rows (MR <= 4): per column, the codes decoded to bytes (SIMD for 4-bit),
// then per 8 codes the weight float32(q - zp) * scale rounded to w.operands and multiplied into MR
// running sums, two chains per row (even and odd groups of 8: one would wait on the FMA latency);
// the last, partial 8 of each block and of K one by one. Codes of up to 4 bits in blocks of 64 or
// more take the block's weights from a table instead: its 16 rounded values, computed once per block by the same
// operations, as 16-bit patterns split into a low-byte and a high-byte pshufb table; 16 codes then
// cost two byte shuffles, two unpacks and two widenings (the same values, a fraction of the work).
template <int MR>
void nbits_rows_rounded(const float* A, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t K = w.K;
  thread_local Scratch codes_storage;
  uint8_t* const codes = codes_storage.get<uint8_t>((w.k_blocks * w.block_size + 31) / 32 * 32);
  // The table costs about 40 cycles per block to build: measured no faster than the direct form at
  // blocks of 32 (4-bit) and slower for 2-bit codes (AMD EPYC family 17h), 30% faster at 128.
  const bool table = w.bits <= 4 && w.block_size >= 64;
  for (int64_t n = n0; n < n1; ++n) {
    decode_padded_column(w, n, codes);
    const float* scales = w.scales + n * w.k_blocks;
    __m256 acc[MR][2];
    float tail[MR];
    for (int m = 0; m < MR; ++m) {
      acc[m][0] = acc[m][1] = _mm256_setzero_ps();
      tail[m] = 0.0f;
    }
    for (int64_t b = 0; b < w.k_blocks; ++b) {
      const int64_t k0 = b * w.block_size, k1 = min_i64(K, k0 + w.block_size);
      const float scale_b = scales[b], zp_b = zero_point(w, n * w.k_blocks + b);
      const __m256 scale = _mm256_set1_ps(scale_b), zp = _mm256_set1_ps(zp_b);
      auto weights = [&](__m256i q) {  // codes q (int32 lanes) to their rounded weights
        return round8(_mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), zp), scale), w.operands);
      };
      __m128i low = _mm_setzero_si128(), high = low;
      if (table) {
        const __m256i first8 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        half_tables(weights(first8), weights(_mm256_add_epi32(first8, _mm256_set1_epi32(8))), w.operands, low, high);
      }
      int64_t k = k0;
      for (; k + 16 <= k1; k += 16) {  // the two chains in registers
        __m256 w0, w1;
        if (table) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k));
          const __m128i lo = _mm_shuffle_epi8(low, q), hi = _mm_shuffle_epi8(high, q);
          w0 = widen_halves(_mm_unpacklo_epi8(lo, hi), w.operands);
          w1 = widen_halves(_mm_unpackhi_epi8(lo, hi), w.operands);
        } else {
          w0 = weights(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k))));
          w1 = weights(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k + 8))));
        }
        for (int m = 0; m < MR; ++m) {
          acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(A + m * K + k), w0, acc[m][0]);
          acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(A + m * K + k + 8), w1, acc[m][1]);
        }
      }
      if (k + 8 <= k1) {
        const __m256 w0 = weights(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k))));
        for (int m = 0; m < MR; ++m) acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(A + m * K + k), w0, acc[m][0]);
        k += 8;
      }
      for (; k < k1; ++k) {
        const float wk = round_operand((static_cast<float>(codes[k]) - zp_b) * scale_b, w.operands);
        for (int m = 0; m < MR; ++m) tail[m] += A[m * K + k] * wk;
      }
    }
    for (int m = 0; m < MR; ++m) {
      const float y = horizontal_sum(_mm256_add_ps(acc[m][0], acc[m][1])) + tail[m];
      Y[m * w.N + n] = bias ? y + bias[n] : y;
    }
  }
}

// Rows [0, M) in passes of up to 4 (one kernel instantiation per row count: registers).
template <template <int> class Kernel>
void in_row_passes(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                   float* Y) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const float* a = A + m0 * w.K;
    float* y = Y + m0 * w.N;
    switch (min_i64(4, M - m0)) {
      case 1: Kernel<1>::run(a, w, n0, n1, bias, y); break;
      case 2: Kernel<2>::run(a, w, n0, n1, bias, y); break;
      case 3: Kernel<3>::run(a, w, n0, n1, bias, y); break;
      default: Kernel<4>::run(a, w, n0, n1, bias, y);
    }
  }
}

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
  // The packed weight, or panels of its layout built per 32 columns from the codes (every pass
  // reads them again, which up to kFactoredMaxRows rows costs less than dequantizing to float32 panels).
  avx2::nbits_rows_packed(A, M, w, n0, n1, bias, Y);
}
}  // namespace

namespace avx2 {

void nbits_rows(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  nbits_rows_avx2(A, M, w, n0, n1, bias, Y);
}
void nbits_round_operands(float* x, int64_t count, NBitsOperands operands) { round_operands(x, count, operands); }

}  // namespace avx2
}  // namespace qmm
