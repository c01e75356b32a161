// nbits_f32_avx512.cpp: AVX-512 MatMulNBits float kernels, accuracy levels 0-3 (the avx512_vnni table's rows and prepare_f32), every width 2-8.
//
// Y[:, n0:n1] for all M rows of A (float32 [M, K]; levels 2/3: already rounded to float16 /
// bfloat16), products and sums in float32. The weight enters every product as dequantize_nbits
// computes it, W = float32(q - zero_point) * scale (two roundings, in that order), rounded to
// float16 / bfloat16 at levels 2 and 3: the zero point is applied before the sum, not after it.
//
// Codes are read in groups of 16 (one zmm of weights; a group never straddles a block, which holds
// a multiple of 16 codes). A group's 2 * bits bytes are broadcast to the register, each dword lane
// gets its code into its low bits, and the code becomes a float weight:
//
//  - lane placement: 2-bit codes from one broadcast dword and 4-bit codes from one broadcast qword
//    by a variable shift alone (vpsrlvd), which leaves them in an order other than k's (below);
//    3, 5, 6, 7 and 8-bit codes in order, by one vpshufb (the two bytes holding each code into its
//    lane) and a variable shift (3-bit groups from a broadcast qword, the others from a broadcast
//    128-bit load);
//  - to a weight: up to 5 bits, a lookup table per block and column, T[c] = W of code c (16
//    floats: vpermps, which reads the index's low 4 bits, so the bits above a 2, 3 or 4-bit code
//    need no mask; 5 bits: two tables and vpermt2ps): the two roundings and the level's rounding
//    happen once per block, not per code. 6, 7 and 8 bits: masked, converted, W computed per lane.
//
// Where the lane order differs from k's (2 and 4 bits), A is permuted to match, once per task
// (decode) or through the panel's row order (prefill). nbits_rows_f32 picks, per task of columns:
//
//  - M <= 12, levels 0/1 without a g_idx: the block-factored kernel on the "quads x16" layout
//    (nbits_packed_f32_avx512.cpp; packed weight, or panels built per call); the prefill below reads
//    a packed weight's panels (nbits_dequantize_packed32) where there is one;
//  - M <= 12 (decode), levels 2/3 or a g_idx: A permuted per group and zero-padded to whole groups; per column, every
//    group's weights are computed in registers once and multiplied into up to 6 rows (passes of
//    up to 6 rows), in 4 / 2 / 1 FMA chains per row (1 / 2-4 / 5-6 rows); k in chunks whose rows
//    of A stay in L1 (4096 codes for one row), the chunks' sums waiting between them in memory;
//    with a g_idx each column is dequantized into a row of floats first (gathered scales and zero
//    points), then one dot product per row in 4 chains;
//  - M > 12 (prefill): per 32 columns, the weights dequantized column by column, transposed
//    (16 x 16) into a float32 panel [K][32] (k in order), then 12 x 32 register tiles of FMAs in
//    order of k over k-chunks of 128 (16 KB of panel, in L1 while every row tile passes); A read
//    in place, or (K a multiple of 1024, or A over 4 MB: interleaves_a) interleaved by k in groups
//    of 12 rows (nbits_prepare_f32, once per call).
//
// A group past K (the last block's padding) is not read; in the last group, lanes past K get
// weight 0 and (decode) A 0. Nothing past the codes buffer is read: a group whose broadcast would
// is read from a copy. docs/matmul_nbits.md gives each path's summation order and bounds its error.
//
// Built twice (CMakeLists.txt, avx512_vnni): natively with -mavx512f/bw/vl/dq, and with QMM_EMULATED
// over SIMDe's AVX-512 for the tests on AVX2 machines: intrinsics only, none that SIMDe lacks
// (_mm512_cvtepu8_epi32, _mm512_cvtps_ph: 256-bit AVX2 / F16C ones instead). Uses AVX-512F, BW
// (vpshufb) and DQ (extractf32x8). Everything is internal except nbits_f32_avx512.h's two functions.
#include "avx512_intrinsics.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "matmul_nbits.h"
#include "nbits_avx2_common.h"
#include "nbits_f32_avx512.h"

namespace qmm {
namespace {

// Up to this many rows the per-column path, more the prefill: the AVX2 crossover, and AVX-512's
// (Zen 4, 4-bit K = N = 4096, level 0, 2 threads: prefill / per-column 1.34-1.40x at 6 rows,
// 1.02-1.07x at 12, 0.79-0.81x at 13, 0.72x at 24, 0.67x at 32).
constexpr int64_t kDecodeMaxRows = 12;
constexpr int kPassRows = 6;  // decode: rows sharing one computation of the weights
constexpr int64_t kChunkGroups = 256;  // decode: groups per k-chunk for one row (16 KB of A), / rows per pass
constexpr int kTileRows = 12;  // prefill: rows per tile and per group of A interleaved by k
constexpr int64_t kPanelColumns = 32;  // prefill: columns per panel (two zmm per k)
constexpr int64_t kPanelChunk = 128;  // prefill: k per sweep of a panel by the row tiles

// ---------------------------------------------------------------------------------------------
// A group of 16 codes in a zmm.

struct Lanes {
  alignas(64) int32_t code[16];  // lane l holds code code[l] of its group
  alignas(64) uint32_t shift[16];  // at this bit of the lane's dword (after the vpshufb)
  alignas(64) uint8_t bytes[64];  // vpshufb: the bytes holding code l into dword l (3, 5, 6, 7, 8 bits)
  alignas(64) float value[32];  // the code each lane of a lookup table stands for (up to 5 bits)
};

constexpr Lanes make_lanes(int bits) {
  Lanes t{};
  for (int l = 0; l < 16; ++l) {
    int code = l, shift = bits * l % 8;
    if (bits == 2) {  // the broadcast dword holds all 16 codes: lane l takes code 4 (l % 4) + l / 4
      code = 4 * (l % 4) + l / 4;
      shift = 2 * code;
    } else if (bits == 4) {  // lanes alternate between the qword's two dwords (codes 0-7, 8-15)
      code = 8 * (l % 2) + 2 * ((l / 2) % 4) + l / 8;
      shift = 4 * code - 32 * (l % 2);
    } else {  // the byte holding the code's first bit and, unless the code is 8 bits, the next one
      const int first = bits * l / 8;
      t.bytes[4 * l] = static_cast<uint8_t>(first);
      t.bytes[4 * l + 1] = static_cast<uint8_t>(bits < 8 ? first + 1 : 0x80);
      t.bytes[4 * l + 2] = t.bytes[4 * l + 3] = 0x80;
    }
    t.code[l] = code;
    t.shift[l] = static_cast<uint32_t>(shift);
  }
  for (int j = 0; j < 32; ++j) t.value[j] = static_cast<float>(bits < 5 ? j % (1 << bits) : j);
  return t;
}

template <int Bits>
constexpr Lanes kLanes = make_lanes(Bits);

// Bytes a group's load reads from its first byte (2 * Bits of them are its codes).
template <int Bits>
constexpr int64_t kRead = Bits == 2   ? 4
                          : Bits <= 4 ? 8
                                      : 16;

// Each lane's code in its low bits: exactly (6, 7, 8 bits) or with higher bits above it that the
// table lookup ignores (2, 3, 4, 5 bits; code_values masks them).
template <int Bits>
inline __m512i group_codes(const uint8_t* p) {
  const Lanes& lanes = kLanes<Bits>;
  const __m512i shift = _mm512_load_si512(lanes.shift);
  if constexpr (Bits == 2) {
    uint32_t x;
    std::memcpy(&x, p, 4);
    return _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(x)), shift);
  } else if constexpr (Bits == 4) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    return _mm512_srlv_epi32(_mm512_set1_epi64(static_cast<long long>(x)), shift);
  } else {
    __m512i v;
    if constexpr (Bits == 3) {
      uint64_t x;
      std::memcpy(&x, p, 8);
      v = _mm512_set1_epi64(static_cast<long long>(x));
    } else {
      v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    v = _mm512_shuffle_epi8(v, _mm512_load_si512(lanes.bytes));
    if constexpr (Bits != 8) v = _mm512_srlv_epi32(v, shift);
    if constexpr (Bits == 6 || Bits == 7) v = _mm512_and_si512(v, _mm512_set1_epi32((1 << Bits) - 1));
    return v;
  }
}

// The codes as floats.
template <int Bits>
inline __m512 code_values(__m512i codes) {
  if constexpr (Bits <= 5) codes = _mm512_and_si512(codes, _mm512_set1_epi32((1 << Bits) - 1));
  return _mm512_cvtepi32_ps(codes);
}

// x rounded to the level's operand type and back (round_operand in matmul_nbits.h, 16 lanes).
inline __m512 round_operands(__m512 x, NBitsOperands operands) {
  if (operands == NBitsOperands::kFloat32) return x;
  if (operands == NBitsOperands::kFloat16) {  // F16C: nearest even, overflow to infinity, NaN kept
#if defined(QMM_EMULATED)
    const __m128i lo = _mm256_cvtps_ph(_mm512_castps512_ps256(x), _MM_FROUND_TO_NEAREST_INT);
    const __m128i hi = _mm256_cvtps_ph(_mm512_extractf32x8_ps(x, 1), _MM_FROUND_TO_NEAREST_INT);
    return _mm512_cvtph_ps(_mm256_set_m128i(hi, lo));
#else
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  }
  const __m512i bits = _mm512_castps_si512(x);  // bfloat16: nearest even by integer arithmetic
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
  const __m512 rounded = _mm512_castsi512_ps(_mm512_and_si512(sum, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, x);  // NaN kept
}

// One block's weights: up to 5 bits the table(s) of W per code, otherwise the zero point and scale.
struct BlockWeights {
  __m512 a, b;
};

template <int Bits>
inline BlockWeights block_weights(float zero_point, float scale, NBitsOperands operands) {
  const __m512 z = _mm512_set1_ps(zero_point), s = _mm512_set1_ps(scale);
  if constexpr (Bits <= 5) {
    const float* value = kLanes<Bits>.value;
    const __m512 t0 = round_operands(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(value), z), s), operands);
    if constexpr (Bits < 5) return {t0, t0};
    return {t0, round_operands(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(value + 16), z), s), operands)};
  } else {
    return {z, s};
  }
}

template <int Bits>
inline __m512 weights(__m512i codes, const BlockWeights& block, NBitsOperands operands) {
  if constexpr (Bits <= 4) return _mm512_permutexvar_ps(codes, block.a);  // index bits 0-3
  else if constexpr (Bits == 5) return _mm512_permutex2var_ps(block.a, codes, block.b);  // bits 0-4
  else return round_operands(_mm512_mul_ps(_mm512_sub_ps(code_values<Bits>(codes), block.a), block.b), operands);
}

// The zero points of column n, blocks [b0, b1), as float32 (x[b - b0]): float ones in place,
// integer ones converted into buffer.
inline const float* zero_points_f32(const NBitsWeight& w, int64_t n, int64_t b0, int64_t b1, float* buffer) {
  const int64_t index = n * w.k_blocks + b0, count = b1 - b0;
  if (!w.zero_points_u8) return w.zero_points + index;
  const uint8_t* z = w.zero_points_u8 + index;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(
        buffer + i, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(z + i)))));
  for (; i < count; ++i) buffer[i] = static_cast<float>(z[i]);
  return buffer;
}

// The weights of one column, group by group: codes read straight from the row while the group's
// load stays inside the codes buffer (rows after n follow row n) and the group inside K; the rest
// from a copy, the last group's lanes past K set to 0. Tables are rebuilt when the block changes.
template <int Bits>
class ColumnWeights {
 public:
  // zero_points: as zero_points_f32 gives them for blocks from b0 on.
  ColumnWeights(const NBitsWeight& w, int64_t n, const float* zero_points, int64_t b0)
      : row_(w.codes + n * w.row_bytes),
        scales_(w.scales + n * w.k_blocks),
        zero_points_(zero_points),
        b0_(b0),
        shift_(__builtin_ctzll(static_cast<unsigned long long>(w.block_size)) - 4),
        groups_((w.K + 15) / 16),
        operands_(w.operands) {
    const int64_t available = (w.N - n) * w.row_bytes;  // bytes from row n to the end of the codes
    const int64_t readable = available >= kRead<Bits> ? (available - kRead<Bits>) / (2 * Bits) + 1 : 0;
    direct_ = min_i64(readable, w.K / 16);
    tail_ = 0;
    for (int l = 0; l < 16; ++l)
      if ((groups_ - 1) * 16 + kLanes<Bits>.code[l] < w.K) tail_ = static_cast<__mmask16>(tail_ | (1u << l));
  }

  __m512 at(int64_t g) {
    const int64_t b = g >> shift_;
    if (b != block_) {
      block_ = b;
      table_ = block_weights<Bits>(zero_points_[b - b0_], scales_[b], operands_);
    }
    if (g < direct_) return weights<Bits>(group_codes<Bits>(row_ + g * 2 * Bits), table_, operands_);
    return _mm512_maskz_mov_ps(g == groups_ - 1 ? tail_ : __mmask16{0xFFFF},
                               weights<Bits>(codes(g), table_, operands_));
  }

  // The codes of group g through a copy of its 2 * Bits bytes (g < groups_: they are in the row).
  __m512i codes(int64_t g) const {
    alignas(16) uint8_t copy[16] = {};
    std::memcpy(copy, row_ + g * 2 * Bits, 2 * Bits);
    return group_codes<Bits>(copy);
  }
  __m512i codes_any(int64_t g) const { return g < direct_ ? group_codes<Bits>(row_ + g * 2 * Bits) : codes(g); }
  __mmask16 lanes(int64_t g) const { return g == groups_ - 1 ? tail_ : __mmask16{0xFFFF}; }
  int64_t direct() const { return direct_; }  // groups below it are read straight from the row, whole

 private:
  const uint8_t* row_;
  const float* scales_;
  const float* zero_points_;  // of blocks b0_ on
  int64_t b0_;
  int shift_;  // block of group g: g >> shift_
  int64_t groups_, direct_;
  NBitsOperands operands_;
  __mmask16 tail_;
  int64_t block_ = -1;
  BlockWeights table_{};
};

// Column n's weights for k < 16 * groups into out, group by group in the lane order of Bits (lanes
// past K zero). With a g_idx each lane takes its own block's scale and zero point (gathered).
template <int Bits>
void dequantize_column(const NBitsWeight& w, int64_t n, float* out, float* zp_buffer) {
  const int64_t groups = (w.K + 15) / 16;
  const float* zero_points = zero_points_f32(w, n, 0, w.k_blocks, zp_buffer);
  ColumnWeights<Bits> column(w, n, zero_points, 0);
  if (!w.g_idx) {
    for (int64_t g = 0; g < groups; ++g) _mm512_store_ps(out + 16 * g, column.at(g));
    return;
  }
  const float* scales = w.scales + n * w.k_blocks;
  const __m512i order = _mm512_load_si512(kLanes<Bits>.code);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i block;
    if (16 * g + 16 <= w.K) {
      block = _mm512_loadu_si512(w.g_idx + 16 * g);
    } else {  // g_idx holds K entries
      alignas(64) int32_t rest[16] = {};
      std::memcpy(rest, w.g_idx + 16 * g, static_cast<size_t>(w.K - 16 * g) * sizeof(int32_t));
      block = _mm512_load_si512(rest);
    }
    block = _mm512_permutexvar_epi32(order, block);  // lane l: code[l]'s block
    const __m512 q = code_values<Bits>(column.codes_any(g));
    const __m512 wv = _mm512_mul_ps(_mm512_sub_ps(q, _mm512_i32gather_ps(block, zero_points, 4)),
                                    _mm512_i32gather_ps(block, scales, 4));
    _mm512_store_ps(out + 16 * g, _mm512_maskz_mov_ps(column.lanes(g), round_operands(wv, w.operands)));
  }
}

inline float reduce_add(__m512 v) {
  return horizontal_sum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// ---------------------------------------------------------------------------------------------
// Decode: M <= 12 rows.

// out[m][16 g + l] = A[m][16 g + code[l]] for 16 g + code[l] < K, else 0; rows of 16 * groups.
void permute_a(const float* A, int64_t M, int64_t K, const int32_t* code, float* out) {
  const int64_t groups = (K + 15) / 16, whole = K / 16, stride = 16 * groups;
  const __m512i order = _mm512_load_si512(code);
  for (int64_t m = 0; m < M; ++m) {
    const float* a = A + m * K;
    float* o = out + m * stride;
    for (int64_t g = 0; g < whole; ++g)
      _mm512_store_ps(o + 16 * g, _mm512_permutexvar_ps(order, _mm512_loadu_ps(a + 16 * g)));
    for (int l = 0; whole < groups && l < 16; ++l) {
      const int64_t k = 16 * whole + code[l];
      o[16 * whole + l] = k < K ? a[k] : 0.0f;
    }
  }
}

// MR rows of the permuted A (row stride lda) against columns [n0, n1). Per k-chunk [g0, g1) and
// column: the column's sums continue from partial ([column][MR][16]) in chain 0; group g of the
// chunk goes to chain (g - g0) % C, except the groups after the last whole step of C groups that
// reads the row directly (the chunk's last (g1 - g0) % C groups, and the last groups of the last
// column where a load would pass the end of the codes), which go to chain 0; the chains are added
// ((0 + 1) + (2 + 3)) at the end of the chunk.
//
// The hot loop takes C groups per step with no per-group checks: a step never straddles a block
// (blocks are powers of two of groups, steps start at multiples of C), so the table is rebuilt per
// group (blocks of 16), per two groups (blocks of 32, C = 4) or where a step starts a block.
template <int Bits, int MR>
void decode_pass(const float* a, int64_t lda, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y,
                 float* partial, float* zp_buffer) {
  constexpr int C = MR == 1 ? 4 : MR <= 4 ? 2 : 1;
  const int64_t groups = (w.K + 15) / 16, block_groups = w.block_size / 16;
  const int shift = __builtin_ctzll(static_cast<unsigned long long>(w.block_size)) - 4;
  const int64_t chunk = max_i64(C, kChunkGroups / MR / C * C);
  const NBitsOperands operands = w.operands;
  // The codes 16 KB ahead into L2 (the rows follow each other: past a column's row, the next
  // columns'), for a weight whose codes exceed kQuadsPrefetchAbove (nbits_avx2_common.h). Zen 4,
  // level 3, M = 1, 4-bit K = 4096, alternating processes, GB/s of codes with / without: weights
  // from L3 (two 8 MB in turn) 1 thread blocks of 128 9.6 / 7.9, N = 11008 9.8 / 8.4, 2 threads 15.5
  // / 11.0, 14.8 / 14.0; from memory (128 MB) 1 thread 9.2 / 7.1, 9.0 / 7.8, 2 threads 15.7 / 13.3,
  // 15.7 / 13.4; blocks of 32 (lookup tables every 32 codes: compute-bound) 4.7-5.9 / 4.6-5.5 at
  // 1 thread, 8.0-10.8 / 5.4-9.2 at 2.
  constexpr int64_t kCodesAhead = 16384;
  const bool prefetch = w.N * w.row_bytes > kQuadsPrefetchAbove;
  for (int64_t g0 = 0; g0 < groups; g0 += chunk) {
    const int64_t g1 = min_i64(groups, g0 + chunk), b0 = g0 >> shift, b1 = ((g1 - 1) >> shift) + 1;
    for (int64_t n = n0; n < n1; ++n) {
      const float* zero_points = zero_points_f32(w, n, b0, b1, zp_buffer);  // of blocks b0 on
      const float* scales = w.scales + n * w.k_blocks;
      const uint8_t* row = w.codes + n * w.row_bytes;
      ColumnWeights<Bits> column(w, n, zero_points, b0);
      float* part = partial + (n - n0) * MR * 16;
      __m512 acc[MR][C];
#pragma GCC unroll 6
      for (int m = 0; m < MR; ++m)
        for (int c = 0; c < C; ++c) acc[m][c] = c == 0 && g0 > 0 ? _mm512_load_ps(part + 16 * m) : _mm512_setzero_ps();
      int64_t g = g0;
      const int64_t steps_end = g0 + max_i64(0, min_i64(g1, column.direct()) - g0) / C * C;
      auto table = [&](int64_t group) {
        const int64_t b = group >> shift;
        return block_weights<Bits>(zero_points[b - b0], scales[b], operands);
      };
      auto steps = [&](auto per) {  // per: groups per table within a step (0: one table per step or more)
        constexpr int Per = decltype(per)::value;
        BlockWeights t = table(g);
        for (; g < steps_end; g += C) {
          if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(row) + g * 2 * Bits + kCodesAhead, _MM_HINT_T1);
          if constexpr (Per == 0) {
            if ((g & (block_groups - 1)) == 0) t = table(g);
          }
#pragma GCC unroll 4
          for (int c = 0; c < C; ++c) {
            if constexpr (Per > 0) {
              if (c % Per == 0) t = table(g + c);
            }
            const __m512 wv = weights<Bits>(group_codes<Bits>(row + (g + c) * 2 * Bits), t, operands);
#pragma GCC unroll 6
            for (int m = 0; m < MR; ++m)
              acc[m][c] = _mm512_fmadd_ps(_mm512_load_ps(a + m * lda + 16 * (g + c)), wv, acc[m][c]);
          }
        }
      };
      if (block_groups >= C) steps(std::integral_constant<int, 0>{});
      else if (block_groups == 1) steps(std::integral_constant<int, 1>{});
      else if constexpr (C == 4) steps(std::integral_constant<int, 2>{});
      for (; g < g1; ++g) {
        const __m512 wv = column.at(g);
#pragma GCC unroll 6
        for (int m = 0; m < MR; ++m) acc[m][0] = _mm512_fmadd_ps(_mm512_load_ps(a + m * lda + 16 * g), wv, acc[m][0]);
      }
#pragma GCC unroll 6
      for (int m = 0; m < MR; ++m) {
        __m512 s = acc[m][0];
        if constexpr (C == 2) s = _mm512_add_ps(acc[m][0], acc[m][1]);
        if constexpr (C == 4)
          s = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
        if (g1 < groups) {
          _mm512_store_ps(part + 16 * m, s);
        } else {
          const float y = reduce_add(s);
          Y[m * w.N + n] = bias ? y + bias[n] : y;
        }
      }
    }
  }
}

// All M rows, in passes of up to kPassRows (as even as possible: 7 rows are 4 + 3).
template <int Bits>
void decode_rows(const float* a, int64_t M, int64_t lda, const NBitsWeight& w, int64_t n0, int64_t n1,
                 const float* bias, float* Y, float* partial, float* zp_buffer) {
  const int64_t passes = (M + kPassRows - 1) / kPassRows;
  for (int64_t m0 = 0, p = 0; m0 < M; ++p) {
    const int64_t rows = (M - m0 + (passes - p) - 1) / (passes - p);
    const float* ap = a + m0 * lda;
    float* y = Y + m0 * w.N;
    switch (rows) {
      case 1: decode_pass<Bits, 1>(ap, lda, w, n0, n1, bias, y, partial, zp_buffer); break;
      case 2: decode_pass<Bits, 2>(ap, lda, w, n0, n1, bias, y, partial, zp_buffer); break;
      case 3: decode_pass<Bits, 3>(ap, lda, w, n0, n1, bias, y, partial, zp_buffer); break;
      case 4: decode_pass<Bits, 4>(ap, lda, w, n0, n1, bias, y, partial, zp_buffer); break;
      case 5: decode_pass<Bits, 5>(ap, lda, w, n0, n1, bias, y, partial, zp_buffer); break;
      default: decode_pass<Bits, 6>(ap, lda, w, n0, n1, bias, y, partial, zp_buffer);
    }
    m0 += rows;
  }
}

// With a g_idx: per column, its weights into wrow, then one dot product per row in 4 chains (group
// g into chain g % 4, the last groups % 4 into chain 0; (0 + 1) + (2 + 3)).
template <int Bits>
void decode_columns(const float* a, int64_t M, int64_t lda, const NBitsWeight& w, int64_t n0, int64_t n1,
                    const float* bias, float* Y, float* wrow, float* zp_buffer) {
  const int64_t groups = lda / 16;
  for (int64_t n = n0; n < n1; ++n) {
    dequantize_column<Bits>(w, n, wrow, zp_buffer);
    for (int64_t m = 0; m < M; ++m) {
      const float* am = a + m * lda;
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      int64_t g = 0;
      for (; g + 4 <= groups; g += 4)
        for (int c = 0; c < 4; ++c)
          acc[c] = _mm512_fmadd_ps(_mm512_load_ps(am + 16 * (g + c)), _mm512_load_ps(wrow + 16 * (g + c)), acc[c]);
      for (; g < groups; ++g)
        acc[0] = _mm512_fmadd_ps(_mm512_load_ps(am + 16 * g), _mm512_load_ps(wrow + 16 * g), acc[0]);
      const float y = reduce_add(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
      Y[m * w.N + n] = bias ? y + bias[n] : y;
    }
  }
}

template <int Bits>
void decode(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t lda = (w.K + 15) / 16 * 16;
  thread_local Scratch a_storage, partial_storage, zp_storage, wrow_storage;
  // Plain pointers: thread_local storage is looked up again on every access the compiler cannot hoist.
  float* const a = a_storage.get<float>(M * lda);
  float* const zp_buffer = zp_storage.get<float>(w.k_blocks + 8);
  permute_a(A, M, w.K, kLanes<Bits>.code, a);
  if (w.g_idx) return decode_columns<Bits>(a, M, lda, w, n0, n1, bias, Y, wrow_storage.get<float>(lda), zp_buffer);
  float* const partial = partial_storage.get<float>((n1 - n0) * kPassRows * 16);
  decode_rows<Bits>(a, M, lda, w, n0, n1, bias, Y, partial, zp_buffer);
}

// ---------------------------------------------------------------------------------------------
// Prefill: more than 12 rows.

#include "transpose16_avx512.inc"

// partial[r][16p + j] (row stride 32) continues its FMA chain over k < kc with A's row r, column k
// (a[k * MR + r]: MR rows interleaved by k; or a[r * lda + k]: A read in place, InPlace) and
// panel[k][16p + j] (row stride 32).
template <int MR, int NP, bool InPlace>
void tile(const float* a, int64_t lda, int64_t kc, const float* panel, float* partial) {
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_loadu_ps(partial + r * kPanelColumns + 16 * p);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 wv[NP];
    for (int p = 0; p < NP; ++p) wv[p] = _mm512_load_ps(panel + k * kPanelColumns + 16 * p);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(InPlace ? a[r * lda + k] : a[k * MR + r]);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(av, wv[p], acc[r][p]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(partial + r * kPanelColumns + 16 * p, acc[r][p]);
}

using Tile = void (*)(const float*, int64_t, int64_t, const float*, float*);
template <int NP, bool InPlace, size_t... R>
constexpr std::array<Tile, kTileRows> tiles_of(std::index_sequence<R...>) {
  return {tile<static_cast<int>(R) + 1, NP, InPlace>...};
}
constexpr std::array<Tile, kTileRows> kTiles[2][2] = {
    // [InPlace][NP - 1][MR - 1]
    {tiles_of<1, false>(std::make_index_sequence<kTileRows>()),
     tiles_of<2, false>(std::make_index_sequence<kTileRows>())},
    {tiles_of<1, true>(std::make_index_sequence<kTileRows>()),
     tiles_of<2, true>(std::make_index_sequence<kTileRows>())},
};

// Whether the prefill reads A interleaved by k (nbits_prepare_f32) rather than in place. In place
// saves the reordering (at 64 x 384 x 384 on two threads about a tenth of the call: the caller
// reorders alone, and the other thread then reads what it wrote) and reads as fast, except where
// a tile's 12 rows are a multiple of 4 KB apart (K % 1024 == 0: they fall into the same L1 sets,
// more rows than its ways; 16 x 4096 x 4096 0.89x, 32 x 3072 x 768 0.86x in place) or A is
// larger than 4 MB (each panel re-reads it: one stream per row group is faster than twelve; 512 x
// 4096 x 4096 0.77x in place). Zen 4, 2 threads; docs/matmul_nbits.md.
bool interleaves_a(int64_t M, int64_t K) { return M > kDecodeMaxRows && (K % 1024 == 0 || M * K > (int64_t{1} << 20)); }

// Columns [n, n + cols) (cols <= 32) dequantized as dequantize_nbits does (and rounded at levels
// 2/3) into panel [16 * ceil(K / 16)][32], k in order, lanes past K zero; with cols <= 16 only the
// first 16 floats of each panel row are written. columns: 16 rows of 16 * ceil(K / 16) floats.
template <int Bits>
void build_panel(const NBitsWeight& w, int64_t n, int64_t cols, float* columns, float* panel, float* zp_buffer) {
  if (w.packed) return QMM_KERNEL_NS::nbits_dequantize_packed32(w, n, cols, panel);  // levels 0/1: no codes
  const int64_t groups = (w.K + 15) / 16, lda = 16 * groups, halves = cols > 16 ? 2 : 1;
  const int32_t* code = kLanes<Bits>.code;
  for (int64_t h = 0; h < halves; ++h) {
    const int64_t count = min_i64(16, cols - 16 * h);
    for (int64_t c = 0; c < count; ++c) dequantize_column<Bits>(w, n + 16 * h + c, columns + c * lda, zp_buffer);
    for (int64_t g = 0; g < groups; ++g) {
      __m512 r[16];
      for (int64_t c = 0; c < 16; ++c)
        r[c] = c < count ? _mm512_load_ps(columns + c * lda + 16 * g) : _mm512_setzero_ps();
      transpose16(r);  // r[j]: the 16 columns at k = 16 g + code[j]
      for (int j = 0; j < 16; ++j) _mm512_store_ps(panel + (16 * g + code[j]) * kPanelColumns + 16 * h, r[j]);
    }
  }
}

// The word of two bfloat16 values (floats whose low 16 bits are zero): k = 2j low, k = 2j + 1 high.
inline __m512i pair_words(__m512 even, __m512 odd) {
  return _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(even), 16),
                         _mm512_and_si512(_mm512_castps_si512(odd), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// The lane of a group that holds its code k (the inverse of kLanes<Bits>.code).
template <int Bits>
constexpr std::array<int, 16> lane_of_code() {
  std::array<int, 16> lane{};
  for (int l = 0; l < 16; ++l) lane[kLanes<Bits>.code[l]] = l;
  return lane;
}

// Columns [n, n + cols) (cols <= 32, codes as given) as build_panel computes them, straight into
// pair panels: each group's transposed rows are paired as they come out (k = 2t with k = 2t + 1),
// no float panel between (it cost a store and a reload of K x 32 floats per panel).
template <int Bits>
void build_pair_panels(const NBitsWeight& w, int64_t n, int64_t cols, float* columns, uint32_t* pairs,
                       float* zp_buffer) {
  const int64_t groups = (w.K + 15) / 16, lda = 16 * groups, KP = (w.K + 1) / 2, halves = cols > 16 ? 2 : 1;
  constexpr std::array<int, 16> lane = lane_of_code<Bits>();
  for (int64_t h = 0; h < halves; ++h) {
    const int64_t count = min_i64(16, cols - 16 * h);
    for (int64_t c = 0; c < count; ++c) dequantize_column<Bits>(w, n + 16 * h + c, columns + c * lda, zp_buffer);
    uint32_t* panel = pairs + h * KP * 16;
    for (int64_t g = 0; g < groups; ++g) {
      __m512 r[16];
      for (int64_t c = 0; c < 16; ++c)
        r[c] = c < count ? _mm512_load_ps(columns + c * lda + 16 * g) : _mm512_setzero_ps();
      transpose16(r);  // r[lane[k]]: the 16 columns at k = 16 g + k (lanes past K zero)
      for (int t = 0; t < 8 && 8 * g + t < KP; ++t)
        _mm512_storeu_si512(panel + (8 * g + t) * 16, pair_words(r[lane[2 * t]], r[lane[2 * t + 1]]));
    }
  }
}

// Columns [n0, n1) in panels of 32: A interleaved by k in groups of 12 rows (nbits_prepare_f32).
// Every output is one FMA chain over k = 0 .. K-1 in order from +0 (the chain waits in partial
// between k-chunks: a float store and load are exact), then + bias.
template <int Bits>
void prefill(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t K = w.K, lda = 16 * ((K + 15) / 16);
  thread_local Scratch columns_storage, panel_storage, partial_storage, zp_storage;
  float* const columns = columns_storage.get<float>(16 * lda);
  float* const panel = panel_storage.get<float>(lda * kPanelColumns);
  float* const partial = partial_storage.get<float>(M * kPanelColumns);
  float* const zp_buffer = zp_storage.get<float>(w.k_blocks + 8);
  const bool in_place = !interleaves_a(M, K);
  const auto& tiles = kTiles[in_place];
  for (int64_t n = n0; n < n1; n += kPanelColumns) {
    const int64_t cols = min_i64(kPanelColumns, n1 - n), halves = cols > 16 ? 2 : 1;
    build_panel<Bits>(w, n, cols, columns, panel, zp_buffer);
    zero_floats(partial, M * kPanelColumns);
    for (int64_t k0 = 0; k0 < K; k0 += kPanelChunk) {
      const int64_t kc = min_i64(kPanelChunk, K - k0);
      for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
        const int64_t rows = min_i64(kTileRows, M - m0);
        const float* a = in_place ? A + m0 * K + k0 : A + m0 * K + k0 * rows;
        tiles[halves - 1][rows - 1](a, K, kc, panel + k0 * kPanelColumns, partial + m0 * kPanelColumns);
      }
    }
    const int64_t whole = cols / 16 * 16;  // whole halves of 16 as vectors, the rest one by one
    for (int64_t m = 0; m < M; ++m) {
      const float* from = partial + m * kPanelColumns;
      float* to = Y + m * w.N + n;
      for (int64_t j = 0; j < whole; j += 16) {
        const __m512 y = _mm512_loadu_ps(from + j);
        _mm512_storeu_ps(to + j, bias ? _mm512_add_ps(y, _mm512_loadu_ps(bias + n + j)) : y);
      }
      for (int64_t j = whole; j < cols; ++j) to[j] = bias ? from[j] + bias[n + j] : from[j];
    }
  }
}

template <int Bits>
void rows_for(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  if (M > kDecodeMaxRows) return prefill<Bits>(A, M, w, n0, n1, bias, Y);
  // Levels 0/1 without a g_idx: block-factored on the quads x16 layout (packed or built per call).
  if (w.operands == NBitsOperands::kFloat32 && !w.g_idx)
    return QMM_KERNEL_NS::nbits_rows_packed_f32(A, M, w, n0, n1, bias, Y);
  decode<Bits>(A, M, w, n0, n1, bias, Y);
}

}  // namespace

namespace QMM_KERNEL_NS {

void nbits_rows_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                    float* Y) {
  switch (w.bits) {
    case 2: return rows_for<2>(A, M, w, n0, n1, bias, Y);
    case 3: return rows_for<3>(A, M, w, n0, n1, bias, Y);
    case 4: return rows_for<4>(A, M, w, n0, n1, bias, Y);
    case 5: return rows_for<5>(A, M, w, n0, n1, bias, Y);
    case 6: return rows_for<6>(A, M, w, n0, n1, bias, Y);
    case 7: return rows_for<7>(A, M, w, n0, n1, bias, Y);
    default: return rows_for<8>(A, M, w, n0, n1, bias, Y);
  }
}

void nbits_pair_panel32(const NBitsWeight& w, int64_t n, int64_t cols, uint32_t* pairs) {
  const int64_t lda = 16 * ((w.K + 15) / 16);
  if (w.bits == 4 && w.block_size >= 32 && !w.g_idx && w.operands == NBitsOperands::kBFloat16 &&
      QMM_KERNEL_NS::nbits_pair_panel32_4bit(w, n, cols, pairs))
    return;
  thread_local Scratch columns_storage, zp_storage;
  float* const columns = columns_storage.get<float>(16 * lda);
  float* const zp_buffer = zp_storage.get<float>(w.k_blocks + 8);
  switch (w.bits) {
    case 2: return build_pair_panels<2>(w, n, cols, columns, pairs, zp_buffer);
    case 3: return build_pair_panels<3>(w, n, cols, columns, pairs, zp_buffer);
    case 4: return build_pair_panels<4>(w, n, cols, columns, pairs, zp_buffer);
    case 5: return build_pair_panels<5>(w, n, cols, columns, pairs, zp_buffer);
    case 6: return build_pair_panels<6>(w, n, cols, columns, pairs, zp_buffer);
    case 7: return build_pair_panels<7>(w, n, cols, columns, pairs, zp_buffer);
    default: return build_pair_panels<8>(w, n, cols, columns, pairs, zp_buffer);
  }
}

// More than 12 rows, where the prefill does not read A in place (interleaves_a): every group of 12
// rows (the last one M % 12, if any) interleaved by k into out, [k][rows of the group], so that a
// tile's broadcasts read one run of floats per k.
bool nbits_prepare_f32(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts) {
  const int64_t K = w.K;
  if (!interleaves_a(M, K)) return false;
  if (!out) return true;
  int64_t g0, g1;
  prepare_share((M + kTileRows - 1) / kTileRows, part, parts, g0, g1);
  for (int64_t m0 = g0 * kTileRows; m0 < M && m0 < g1 * kTileRows; m0 += kTileRows) {
    const int64_t rows = min_i64(kTileRows, M - m0);
    const float* src = A + m0 * K;
    float* dst = out + m0 * K;
    int64_t k = 0;
    if (rows == kTileRows)  // 16 k at a time: 12 rows (and 4 of zeros) transposed, 12 floats stored per k
      for (; k + 16 <= K; k += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = i < kTileRows ? _mm512_loadu_ps(src + i * K + k) : _mm512_setzero_ps();
        transpose16(r);
        for (int j = 0; j < 16; ++j) {
          float* at = dst + (k + j) * kTileRows;
          _mm256_storeu_ps(at, _mm512_castps512_ps256(r[j]));
          _mm_storeu_ps(at + 8, _mm512_extractf32x4_ps(r[j], 2));
        }
      }
    // The rest, k by k (the rows' reads in order, the writes contiguous: the other way round, a
    // scalar store every 48 bytes took about 2 ns per value).
    for (; k < K; ++k)
      for (int64_t r = 0; r < rows; ++r) dst[k * rows + r] = src[r * K + k];
  }
  return true;
}

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
