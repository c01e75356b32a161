// nbits_packed_avx2.cpp: AVX2 MatMulNBits level 4 on a weight packed once in the "quads x16" layout (kNBitsQuads16, matmul_nbits.h): the few-row kernel and the GEMM's panel from it.
//
// Each 64-byte run of the layout is read as two vectors, the halves of 8 columns. A load, a shift
// and a mask give one quad of codes for 8 columns, and one broadcast of four int8 of A meets both
// halves in vpmaddubsw: each column's block sum comes out in its own int32 lane, with no reduction
// across lanes (the row-wise kernel of nbits_int8_avx2.cpp reduces 8 blocks' vectors with hadds,
// which took most of its time). Codes past K meet qa = 0, whatever they hold. The int8 GEMM (16+
// rows) takes its [k/4][16 columns][4 codes] byte panel from a panel of the layout by the same
// shifts and masks (nbits_panel_from_packed).
//
// The block sums are exact (vpmaddubsw pair sums added in int16 for at most int16_steps(bits)
// quads, then widened; 8-bit codes as |c - 128| x (qa with the sign of c - 128), widened per quad,
// plus 128 * sum qa so that the sum is sum qa * c). The float32 epilogue is the order of
// docs/matmul_nbits.md ("Float32 order of level 4"): below 8 rows, lane i of the row-wise kernel's
// vectors takes blocks b = i mod 8, here one vector per residue with the columns in the lanes; from
// 8 rows, the GEMM's blocks in order. So the results are those of the unpacked kernels (and of the
// other x86 tables) bit for bit (tests/test_nbits_packed.py).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "nbits_avx2.h"
#include "nbits_avx2_common.h"
#include "nbits_decode_avx2.h"

namespace qmm {
namespace {

constexpr int64_t kPanel = kQuadsPanel;

// Eight columns' scale * zero point from `at` on in a panel's per-block data: the scales sb times
// the panel's float or uint8 zero points (one float32 product).
inline __m256 scaled_zero_points8(const QuadsPanel& panel, __m256 sb, int64_t at) {
  if (!panel.zero_points) return _mm256_mul_ps(sb, _mm256_load_ps(panel.float_zero_points + at));
  const __m128i z = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(panel.zero_points + at));
  return _mm256_mul_ps(sb, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z)));
}

// The row-wise kernel's horizontal_sum, with the lanes in 8 vectors: (v0 + v4 + v2 + v6) + (v1 + v5 + v3 + v7)
// in the order ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
inline __m256 lane_sums(const __m256 v[8]) {
  const __m256 s0 = _mm256_add_ps(v[0], v[4]), s1 = _mm256_add_ps(v[1], v[5]);
  const __m256 s2 = _mm256_add_ps(v[2], v[6]), s3 = _mm256_add_ps(v[3], v[7]);
  return _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
}

// Quad j of a group's vector: its codes as bytes.
template <int S>
inline __m256i quad_codes(__m256i packed_codes, int j, __m256i mask) {
  if constexpr (S == 8) return packed_codes;
  return _mm256_and_si256(j ? _mm256_srli_epi16(packed_codes, S * j) : packed_codes, mask);
}

// The exact int32 block sums of rows m0 .. m0+MR-1 with block b of a panel, two halves of 8
// columns: dot[r][half]. S: the codes' width in the layout; Signed8: 8-bit codes (held as
// c - 128); steps: groups whose int16 sums may add up before widening (not Signed8).
template <int S, bool Signed8, int MR>
inline void block_sums(const uint8_t* block, const int8_t* const qa[MR], int64_t k0, int64_t groups, int64_t steps,
                       const int32_t* sums, __m256i dot[MR][2]) {
  constexpr int Q = 8 / S;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << S) - 1)), ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
  for (int64_t g0 = 0; g0 < groups; g0 += steps) {
    const int64_t g1 = min_i64(groups, g0 + steps);
    __m256i sum16[MR][2];
    for (int r = 0; r < MR; ++r) sum16[r][0] = sum16[r][1] = _mm256_setzero_si256();
    for (int64_t g = g0; g < g1; ++g) {
      const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + 64 * g));
      const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + 64 * g + 32));
      for (int j = 0; j < Q; ++j) {
        const int64_t k = k0 + 4 * (g * Q + j);
        if constexpr (Signed8) {
          const __m256i lo_magnitude = _mm256_abs_epi8(lo), hi_magnitude = _mm256_abs_epi8(hi);
          for (int r = 0; r < MR; ++r) {
            int32_t four;
            std::memcpy(&four, qa[r] + k, 4);
            const __m256i a = _mm256_set1_epi32(four);
            dot[r][0] = _mm256_add_epi32(
                dot[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo_magnitude, _mm256_sign_epi8(a, lo)), ones));
            dot[r][1] = _mm256_add_epi32(
                dot[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi_magnitude, _mm256_sign_epi8(a, hi)), ones));
          }
        } else {
          const __m256i lo_codes = quad_codes<S>(lo, j, mask), hi_codes = quad_codes<S>(hi, j, mask);
          for (int r = 0; r < MR; ++r) {
            int32_t four;
            std::memcpy(&four, qa[r] + k, 4);
            const __m256i a = _mm256_set1_epi32(four);
            sum16[r][0] = _mm256_add_epi16(sum16[r][0], _mm256_maddubs_epi16(lo_codes, a));
            sum16[r][1] = _mm256_add_epi16(sum16[r][1], _mm256_maddubs_epi16(hi_codes, a));
          }
        }
      }
    }
    if constexpr (!Signed8)
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < 2; ++h) dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(sum16[r][h], ones));
  }
  if constexpr (Signed8)  // sum qa (c - 128) + 128 sum qa = sum qa c (exact: it fits int32)
    for (int r = 0; r < MR; ++r) {
      const __m256i offset = _mm256_set1_epi32(128 * sums[r]);
      dot[r][0] = _mm256_add_epi32(dot[r][0], offset);
      dot[r][1] = _mm256_add_epi32(dot[r][1], offset);
    }
}

// Rows m0 .. m0+MR-1 of A against panel p (16 columns); Groups: groups of quads per block when
// known at compile time (0: at run time). InOrder: the float32 order of 8+ rows (the GEMM's: per
// output, blocks in order, y = fma(D, p, y) then y = fnmadd(block_sum, sb * zp, y)); else that of
// fewer rows (residues mod 8, then the blocks left over).
template <int S, bool Signed8, int MR, int Groups, bool InOrder>
void panel_rows(const QuantizedA& a, int64_t m0, const NBitsWeight& w, int64_t p, const QuadsPanel& panel,
                int64_t steps, const int32_t* qa_sums, const float* bias, float* Y) {
  constexpr int Q = 8 / S;
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, bytes = quads_block_bytes(w);
  const int64_t groups = Groups ? Groups : bs / 4 / Q;
  const QuadsPrefetchL1 prefetch(w);
  const uint8_t* codes = panel.codes;
  const float* sb_panel = panel.scales;
  const int8_t* qa[MR];
  for (int r = 0; r < MR; ++r) qa[r] = a.qa + (m0 + r) * padded;
  const float* scale_a = a.scale + m0 * kb;
  const float* block_sum = a.block_sum + m0 * kb;
  // Per row and half: one vector per residue of the block mod 8 (the row-wise kernel's lanes).
  __m256 acc[MR][2][8], correction[MR][2][8], y[MR][2];
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) acc[r][h][i] = correction[r][h][i] = _mm256_setzero_ps();
  const int64_t whole = InOrder ? 0 : kb / 8 * 8;
  if constexpr (InOrder)
    for (int r = 0; r < MR; ++r) y[r][0] = y[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    if (!InOrder && b == whole)
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < 2; ++h) y[r][h] = _mm256_sub_ps(lane_sums(acc[r][h]), lane_sums(correction[r][h]));
    prefetch(panel, b);
    int32_t sums[MR];
    if constexpr (Signed8)
      for (int r = 0; r < MR; ++r) sums[r] = qa_sums[(m0 + r) * kb + b];
    __m256i dot[MR][2];
    block_sums<S, Signed8, MR>(codes + b * bytes, qa, b * bs, groups, steps, sums, dot);
    for (int h = 0; h < 2; ++h) {
      const __m256 sb = _mm256_load_ps(sb_panel + b * kPanel + 8 * h);
      const __m256 szp = scaled_zero_points8(panel, sb, b * kPanel + 8 * h);
      for (int r = 0; r < MR; ++r) {
        const __m256 product = _mm256_mul_ps(_mm256_set1_ps(scale_a[r * kb + b]), sb);
        const __m256 total = _mm256_cvtepi32_ps(dot[r][h]), bsum = _mm256_set1_ps(block_sum[r * kb + b]);
        if constexpr (InOrder) {
          y[r][h] = _mm256_fnmadd_ps(bsum, szp, _mm256_fmadd_ps(total, product, y[r][h]));
        } else if (b < whole) {
          acc[r][h][b % 8] = _mm256_fmadd_ps(total, product, acc[r][h][b % 8]);
          correction[r][h][b % 8] = _mm256_fmadd_ps(bsum, szp, correction[r][h][b % 8]);
        } else {  // y + ((p * D) - block_sum * (sb * zp)), rounded step by step
          y[r][h] = _mm256_add_ps(y[r][h], _mm256_sub_ps(_mm256_mul_ps(product, total), _mm256_mul_ps(bsum, szp)));
        }
      }
    }
  }
  if (!InOrder && whole == kb)
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < 2; ++h) y[r][h] = _mm256_sub_ps(lane_sums(acc[r][h]), lane_sums(correction[r][h]));
  const int64_t n0 = p * kPanel, cols = min_i64(kPanel, w.N - n0);
  for (int r = 0; r < MR; ++r) {
    alignas(32) float out[16];
    _mm256_store_ps(out, y[r][0]);
    _mm256_store_ps(out + 8, y[r][1]);
    float* row = Y + (m0 + r) * w.N + n0;
    for (int64_t c = 0; c < cols; ++c) row[c] = bias ? out[c] + bias[n0 + c] : out[c];
  }
}

template <int S, bool Signed8, int Groups>
void panels_rows(const QuantizedA& a, const NBitsWeight& w, int64_t p0, int64_t p1, const int32_t* qa_sums,
                 const float* bias, float* Y) {
  const int64_t steps = Signed8 ? 1 : max_i64(1, int16_steps(w.bits) / (8 / S));  // in groups of 8/S quads
  quads_row_passes(a.M, p0, p1, [&](auto mr, auto in_order, int64_t p, int64_t m0) {
    panel_rows<S, Signed8, decltype(mr)::value, Groups, decltype(in_order)::value>(a, m0, w, p, quads_panel(w, p),
                                                                                   steps, qa_sums, bias, Y);
  });
}

// Blocks of 32 codes (the usual size) with a compile-time group count.
template <int S, bool Signed8>
void panels_rows_sized(const QuantizedA& a, const NBitsWeight& w, int64_t p0, int64_t p1, const int32_t* qa_sums,
                       const float* bias, float* Y) {
  if (w.block_size == 32) return panels_rows<S, Signed8, 8 / (8 / S)>(a, w, p0, p1, qa_sums, bias, Y);
  panels_rows<S, Signed8, 0>(a, w, p0, p1, qa_sums, bias, Y);
}

// ---- Levels 0/1 (float32 operands), few rows ----
//
// The codes of a quad for 8 columns become float32 lanes, one column per lane: a shift and a mask
// give the quad (as for level 4), one vpshufb per k of the quad moves byte i of each column's dword
// to the dword's low byte, and vcvtdq2ps widens it. One broadcast of a[k] per row meets the lanes in
// one FMA per half of 16 columns. Per output, in float32 with every product fused into its sum:
//   dot_b = a[k0] q[k0] + a[k0 + 1] q[k0 + 1] + ... over block b's k in order, from +0;
//   y = fnmadd(asum_b, scale_b * zero_point_b, fma(dot_b, scale_b, y)) for the blocks in order from
//   y = +0 (asum_b: the block's sum of A in order of k from +0); then y + bias.
// The codes come from the packed weight (MatMulNBits holds it) or, for codes as they are, from a
// panel of the same layout built per 16 columns (nbits_rows_panel, 4-bit storage for 3- and 4-bit codes,
// one byte per code otherwise): the same order either way, so the held weight gives matmul_nbits'
// bits. One row takes two panels at once (four independent chains); 2 to 4 rows one panel.

// vpshufb indices: byte i of each dword to the dword's low byte, the rest zero (per 128-bit lane,
// as vpshufb works).
#define QMM_DWORD_BYTE(i)                                                   \
  {i, -1, -1, -1, 4 + i, -1, -1, -1, 8 + i, -1, -1, -1, 12 + i, -1, -1, -1, \
   i, -1, -1, -1, 4 + i, -1, -1, -1, 8 + i, -1, -1, -1, 12 + i, -1, -1, -1}
alignas(32) constexpr int8_t kDwordByte[4][32] = {QMM_DWORD_BYTE(0), QMM_DWORD_BYTE(1), QMM_DWORD_BYTE(2),
                                                  QMM_DWORD_BYTE(3)};
#undef QMM_DWORD_BYTE

// Byte i of each dword of x, zero-extended.
inline __m256i dword_byte(__m256i x, int i) {
  return _mm256_shuffle_epi8(x, _mm256_load_si256(reinterpret_cast<const __m256i*>(kDwordByte[i])));
}

// One quad of k (k .. k+3) for MR rows and H halves of 8 columns: per k, byte i of each column's
// dword (vpshufb, the index from memory) widened to float32, one broadcast of a[r][k] per row, one
// FMA per row and half into dot[r][h]. In asm so that the MR * H chains stay in registers: compiled
// from intrinsics, GCC kept some in memory (a store-to-load round trip on every FMA, 2-3x slower).
// ymm11..14 hold a k's H widened quads, ymm15 the broadcast.
// clang-format off
#define QMM_WIDEN(i, c, t) "vpshufb " #i "*32(%[index]), %[" #c "], %%ymm" #t "\n\tvcvtdq2ps %%ymm" #t ", %%ymm" #t "\n\t"
#define QMM_BCAST(i, a) "vbroadcastss " #i "*4(%[" #a "]), %%ymm15\n\t"
#define QMM_FMA(t, d) "vfmadd231ps %%ymm" #t ", %%ymm15, %[" #d "]\n\t"
#define QMM_ROW2(i, a, d0, d1) QMM_BCAST(i, a) QMM_FMA(11, d0) QMM_FMA(12, d1)
#define QMM_STEP_H4(i) QMM_WIDEN(i, c0, 11) QMM_WIDEN(i, c1, 12) QMM_WIDEN(i, c2, 13) QMM_WIDEN(i, c3, 14) \
  QMM_BCAST(i, a0) QMM_FMA(11, d0) QMM_FMA(12, d1) QMM_FMA(13, d2) QMM_FMA(14, d3)
#define QMM_STEP_H2(i, rows) QMM_WIDEN(i, c0, 11) QMM_WIDEN(i, c1, 12) rows
#define QMM_ROWS1(i) QMM_ROW2(i, a0, d0, d1)
#define QMM_ROWS2(i) QMM_ROWS1(i) QMM_ROW2(i, a1, d2, d3)
#define QMM_ROWS3(i) QMM_ROWS2(i) QMM_ROW2(i, a2, d4, d5)
#define QMM_ROWS4(i) QMM_ROWS3(i) QMM_ROW2(i, a3, d6, d7)
// clang-format on
#define QMM_CLOBBERS "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

template <int MR, int H>
inline void quad_fmas(const float* const a[MR], int64_t k, const __m256i c[H], __m256 d[MR * H]) {
  const int8_t* index = &kDwordByte[0][0];
  const float *a0 = a[0] + k, *a1 = a[MR > 1 ? 1 : 0] + k, *a2 = a[MR > 2 ? 2 : 0] + k, *a3 = a[MR > 3 ? 3 : 0] + k;
  if constexpr (H == 4) {
    static_assert(MR == 1);
#define QMM_S(i) QMM_STEP_H4(i)
    asm(QMM_S(0) QMM_S(1) QMM_S(2) QMM_S(3)
        : [d0] "+x"(d[0]), [d1] "+x"(d[1]), [d2] "+x"(d[2]), [d3] "+x"(d[3])
        : [c0] "x"(c[0]), [c1] "x"(c[1]), [c2] "x"(c[2]), [c3] "x"(c[3]), [a0] "r"(a0), [index] "r"(index),
          "m"(kDwordByte)
        : QMM_CLOBBERS);
#undef QMM_S
  } else if constexpr (MR == 1) {
#define QMM_S(i) QMM_STEP_H2(i, QMM_ROWS1(i))
    asm(QMM_S(0) QMM_S(1) QMM_S(2) QMM_S(3)
        : [d0] "+x"(d[0]), [d1] "+x"(d[1])
        : [c0] "x"(c[0]), [c1] "x"(c[1]), [a0] "r"(a0), [index] "r"(index), "m"(kDwordByte)
        : QMM_CLOBBERS);
#undef QMM_S
  } else if constexpr (MR == 2) {
#define QMM_S(i) QMM_STEP_H2(i, QMM_ROWS2(i))
    asm(QMM_S(0) QMM_S(1) QMM_S(2) QMM_S(3)
        : [d0] "+x"(d[0]), [d1] "+x"(d[1]), [d2] "+x"(d[2]), [d3] "+x"(d[3])
        : [c0] "x"(c[0]), [c1] "x"(c[1]), [a0] "r"(a0), [a1] "r"(a1), [index] "r"(index), "m"(kDwordByte)
        : QMM_CLOBBERS);
#undef QMM_S
  } else if constexpr (MR == 3) {
#define QMM_S(i) QMM_STEP_H2(i, QMM_ROWS3(i))
    asm(QMM_S(0) QMM_S(1) QMM_S(2) QMM_S(3)
        : [d0] "+x"(d[0]), [d1] "+x"(d[1]), [d2] "+x"(d[2]), [d3] "+x"(d[3]), [d4] "+x"(d[4]), [d5] "+x"(d[5])
        : [c0] "x"(c[0]), [c1] "x"(c[1]), [a0] "r"(a0), [a1] "r"(a1), [a2] "r"(a2), [index] "r"(index), "m"(kDwordByte)
        : QMM_CLOBBERS);
#undef QMM_S
  } else {
    static_assert(MR == 4);
#define QMM_S(i) QMM_STEP_H2(i, QMM_ROWS4(i))
    asm(QMM_S(0) QMM_S(1) QMM_S(2) QMM_S(3)
        : [d0] "+x"(d[0]), [d1] "+x"(d[1]), [d2] "+x"(d[2]), [d3] "+x"(d[3]), [d4] "+x"(d[4]), [d5] "+x"(d[5]),
          [d6] "+x"(d[6]), [d7] "+x"(d[7])
        : [c0] "x"(c[0]), [c1] "x"(c[1]), [a0] "r"(a0), [a1] "r"(a1), [a2] "r"(a2), [a3] "r"(a3), [index] "r"(index),
          "m"(kDwordByte)
        : QMM_CLOBBERS);
#undef QMM_S
  }
}
#undef QMM_CLOBBERS
#undef QMM_ROWS4
#undef QMM_ROWS3
#undef QMM_ROWS2
#undef QMM_ROWS1
#undef QMM_STEP_H2
#undef QMM_STEP_H4
#undef QMM_ROW2
#undef QMM_FMA
#undef QMM_BCAST
#undef QMM_WIDEN

// Rows a[0 .. MR) against P panels (16 columns each) of the layout with codes S bits wide (Signed8:
// 8-bit codes held as c - 128); asum: the rows' block sums [MR][k_blocks]; Y: row 0's output, columns
// n0[p] .. of panel p.
template <int S, bool Signed8, int MR, int P, int Groups>
void panel_rows_f32(const float* const a[MR], const float* asum, const QuadsPanel panels[P], const int64_t n0[P],
                    const NBitsWeight& w, const float* bias, float* Y) {
  constexpr int Q = 8 / S, H = 2 * P;  // H halves of 8 columns
  const int64_t kb = w.k_blocks, bs = w.block_size, bytes = bs * S * 2;  // quads_block_bytes for width S
  const int64_t groups = Groups ? Groups : bs / 4 / Q;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << S) - 1));
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 y[MR][H];
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < H; ++h) y[r][h] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    __m256 dot[MR][H];  // [r][h] = d[r * H + h] of quad_fmas
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < H; ++h) dot[r][h] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g)
      for (int j = 0; j < Q; ++j) {
        __m256i codes[H];  // loaded again per quad (from L1): fewer registers live across the quads
        for (int h = 0; h < H; ++h) {
          __m256i x = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(panels[h / 2].codes + b * bytes + 64 * g + 32 * (h % 2)));
          if constexpr (Signed8) x = _mm256_xor_si256(x, flip);  // held as c - 128: back to c
          codes[h] = quad_codes<S>(x, j, mask);
        }
        quad_fmas<MR, H>(a, b * bs + 4 * (g * Q + j), codes, &dot[0][0]);
      }
    for (int h = 0; h < H; ++h) {
      const __m256 sb = _mm256_load_ps(panels[h / 2].scales + b * kPanel + 8 * (h % 2));
      const __m256 szp = scaled_zero_points8(panels[h / 2], sb, b * kPanel + 8 * (h % 2));
      for (int r = 0; r < MR; ++r)
        y[r][h] = _mm256_fnmadd_ps(_mm256_set1_ps(asum[r * kb + b]), szp, _mm256_fmadd_ps(dot[r][h], sb, y[r][h]));
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t cols = min_i64(kPanel, w.N - n0[p]);
    for (int r = 0; r < MR; ++r) {
      alignas(32) float out[16];
      _mm256_store_ps(out, y[r][2 * p]);
      _mm256_store_ps(out + 8, y[r][2 * p + 1]);
      float* row = Y + r * w.N + n0[p];
      for (int64_t c = 0; c < cols; ++c) row[c] = bias ? out[c] + bias[n0[p] + c] : out[c];
    }
  }
}

// Nibbles n0 .. n7 of a dword (n_t = code t of a row of 4-bit codes, bits 4t) to the layout's
// order: byte i = n_i | n_{4+i} << 4. The middle bytes swap, then each word's middle nibbles.
inline uint32_t quads_order(uint32_t x) {
  x = (x & 0xFF0000FFu) | ((x >> 8) & 0x0000FF00u) | ((x << 8) & 0x00FF0000u);
  const uint32_t t = (x ^ (x >> 4)) & 0x00F000F0u;
  return x ^ t ^ (t << 4);
}
inline __m256i quads_order(__m256i x) {
  const __m256i middle = _mm256_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15, 0, 2, 1, 3, 4, 6, 5, 7,
                                          8, 10, 9, 11, 12, 14, 13, 15);
  x = _mm256_shuffle_epi8(x, middle);
  const __m256i t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi32(x, 4)), _mm256_set1_epi32(0x00F000F0));
  return _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi32(t, 4)));
}

}  // namespace

// Columns [n0, n0 + 16) of w's codes (as they are) as a panel of the layout (codes, and per block
// the scales and float zero points, zeros past N), as quads_pack writes it for 3- and 4-bit codes
// (S = 4; 3-bit ones transcoded to 4-bit rows first) and for 8-bit ones with the codes unchanged
// (S = 8, not c - 128); 2-, 5-, 6- and 7-bit codes one byte per code (S = 8). Per 4 k-groups (a
// dword of each column's row each), 8 columns' dwords transposed in registers (4 x 4 per lane).
// columns: room for 16 rows of `stride` bytes. (The AVX-512 few-row kernel builds its panels with it too.)
void avx2::nbits_rows_panel(const NBitsWeight& w, int64_t n0, uint8_t* columns, int64_t stride, uint8_t* codes,
                            float* scales, float* float_zero_points) {
  const int64_t kb = w.k_blocks, padded = kb * w.block_size, cols = min_i64(kPanel, w.N - n0);
  const int S = w.bits == 4 || w.bits == 3 ? 4 : 8;
  const int64_t dwords = padded * S / 32;  // per row: one per k-group of 32 / S codes
  const uint8_t* src[kPanel];
  for (int64_t c = 0; c < kPanel; ++c) {
    uint8_t* buffer = columns + c * stride;
    const uint8_t* row = w.codes + (n0 + c) * w.row_bytes;
    if (c >= cols) std::memset(buffer, 0, static_cast<size_t>(4 * dwords));  // past N: code 0 (scale 0)
    else if (w.bits == 3) transcode_3bit_to_4bit(row, padded, w.row_bytes, buffer);
    else if (w.bits != 4 && w.bits != 8) decode_padded_column(w, n0 + c, buffer);
    src[c] = c < cols && (w.bits == 4 || w.bits == 8) ? row : buffer;
  }
  int64_t g = 0;
  for (; g + 4 <= dwords; g += 4)
    for (int64_t c = 0; c < kPanel; c += 8) {
      __m256i y[4];
      for (int t = 0; t < 4; ++t)
        y[t] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(src[c + 4 + t] + 4 * g),
                                   reinterpret_cast<const __m128i*>(src[c + t] + 4 * g));
      const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpacklo_epi32(y[2], y[3]);
      const __m256i t2 = _mm256_unpackhi_epi32(y[0], y[1]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
      __m256i r[4] = {_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1), _mm256_unpacklo_epi64(t2, t3),
                      _mm256_unpackhi_epi64(t2, t3)};  // group g + t, columns c .. c+7
      for (int t = 0; t < 4; ++t) {
        if (S == 4) r[t] = quads_order(r[t]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + (g + t) * 64 + 4 * c), r[t]);
      }
    }
  for (; g < dwords; ++g)  // fewer than 4 groups left (4-bit codes, blocks of 16, an odd count)
    for (int64_t c = 0; c < kPanel; ++c) {
      uint32_t x;
      std::memcpy(&x, src[c] + 4 * g, 4);
      if (S == 4) x = quads_order(x);
      std::memcpy(codes + g * 64 + 4 * c, &x, 4);
    }
  quads_block_data(w, n0, scales, float_zero_points);
}

namespace {

// Panels [p0, p1) for rows [0, M) of A (rows: padded to k_blocks * block_size), in passes of up to
// 4 rows (one row: two panels at a time). panel(p, slot) gives panel p's codes, scales and zero
// points (slot: 0 or 1, room for a panel built on the fly).
template <int S, bool Signed8, int Groups, class PanelOf>
void panels_rows_f32(const float* rows, const float* asum, int64_t M, const NBitsWeight& w, int64_t p0, int64_t p1,
                     const float* bias, float* Y, PanelOf panel) {
  const int64_t padded = w.k_blocks * w.block_size, kb = w.k_blocks;
  for (int64_t p = p0; p < p1; p += 2) {
    const int P = p + 1 < p1 ? 2 : 1;
    const QuadsPanel two[2] = {panel(p, 0), P == 2 ? panel(p + 1, 1) : QuadsPanel{}};
    const int64_t n0[2] = {p * kPanel, (p + 1) * kPanel};
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const float* a[4];
      for (int r = 0; r < 4; ++r) a[r] = rows + min_i64(m0 + r, M - 1) * padded;
      const float* s = asum + m0 * kb;
      float* y = Y + m0 * w.N;
      const int64_t pass = min_i64(4, M - m0);
      if (pass == 1 && P == 2) {
        panel_rows_f32<S, Signed8, 1, 2, Groups>(a, s, two, n0, w, bias, y);
        continue;
      }
      for (int t = 0; t < P; ++t) switch (pass) {
          case 1: panel_rows_f32<S, Signed8, 1, 1, Groups>(a, s, two + t, n0 + t, w, bias, y); break;
          case 2: panel_rows_f32<S, Signed8, 2, 1, Groups>(a, s, two + t, n0 + t, w, bias, y); break;
          case 3: panel_rows_f32<S, Signed8, 3, 1, Groups>(a, s, two + t, n0 + t, w, bias, y); break;
          default: panel_rows_f32<S, Signed8, 4, 1, Groups>(a, s, two + t, n0 + t, w, bias, y);
        }
    }
  }
}

template <int S, bool Signed8, class PanelOf>
void panels_rows_f32_sized(const float* rows, const float* asum, int64_t M, const NBitsWeight& w, int64_t p0,
                           int64_t p1, const float* bias, float* Y, PanelOf panel) {
  if (w.block_size == 32) return panels_rows_f32<S, Signed8, 8 / (8 / S)>(rows, asum, M, w, p0, p1, bias, Y, panel);
  panels_rows_f32<S, Signed8, 0>(rows, asum, M, w, p0, p1, bias, Y, panel);
}

}  // namespace

namespace avx2 {

void nbits_rows_int8_packed(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                            float* Y) {
  const int64_t p0 = n0 / kPanel, p1 = (n1 + kPanel - 1) / kPanel;  // n0: a multiple of the panel (the driver's tasks)
  if (w.bits == 8) {
    // sum qa per row and block, for the 8-bit codes' offset
    const int64_t kb = w.k_blocks, bs = w.block_size;
    thread_local Scratch sums_storage;
    int32_t* const sums = sums_storage.get<int32_t>(a.M * kb);
    for (int64_t m = 0; m < a.M; ++m)
      for (int64_t b = 0; b < kb; ++b) {
        const int8_t* q = a.qa + m * a.padded_K + b * bs;
        int32_t s = 0;
        for (int64_t j = 0; j < bs; ++j) s += q[j];
        sums[m * kb + b] = s;
      }
    return panels_rows_sized<8, true>(a, w, p0, p1, sums, bias, Y);
  }
  switch (quads_storage_bits(w.bits)) {
    case 2: return panels_rows_sized<2, false>(a, w, p0, p1, nullptr, bias, Y);
    case 4: return panels_rows_sized<4, false>(a, w, p0, p1, nullptr, bias, Y);
    default: return panels_rows_sized<8, false>(a, w, p0, p1, nullptr, bias, Y);
  }
}

void nbits_rows_packed(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                       float* Y) {
  // Two panels built at a time for the codes as they are.
  quads_rows_f32(A, M, w, n0, n1, 2, nbits_rows_panel,
                 [&](auto s, auto signed8, const float* rows, const float* asum, int64_t p0, int64_t p1, auto panel) {
                   panels_rows_f32_sized<decltype(s)::value, decltype(signed8)::value>(rows, asum, M, w, p0, p1, bias,
                                                                                       Y, panel);
                 });
}

void nbits_dequantize_packed(const NBitsWeight& w, int64_t n0, float* panel) {
  const int64_t K = w.K, K8 = (K + 7) / 8 * 8, bs = w.block_size, bytes = quads_block_bytes(w);
  const int S = static_cast<int>(quads_storage_bits(w.bits)), Q = 8 / S;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << S) - 1));
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(w.bits == 8 ? 0x80 : 0));  // 8-bit: held as c - 128
  const QuadsPanel data = quads_panel(w, n0 / kPanel);  // scales and zero points 0 past N: (q - 0) * 0
  const uint8_t* const codes = data.codes;
  for (int64_t b = 0; b * bs < K8; ++b) {
    const __m256 scale0 = _mm256_load_ps(data.scales + b * kPanel),
                 scale1 = _mm256_load_ps(data.scales + b * kPanel + 8);
    __m256 zp0, zp1;
    if (data.zero_points) {
      const __m128i z = _mm_load_si128(reinterpret_cast<const __m128i*>(data.zero_points + b * kPanel));
      zp0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z));
      zp1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(z, 8)));
    } else {
      zp0 = _mm256_load_ps(data.float_zero_points + b * kPanel);
      zp1 = _mm256_load_ps(data.float_zero_points + b * kPanel + 8);
    }
    for (int64_t g = 0; g < bs / 4 / Q; ++g)
      for (int j = 0; j < Q; ++j) {
        const int64_t k0 = b * bs + 4 * (g * Q + j);
        if (k0 >= K8) break;
        const uint8_t* run = codes + b * bytes + 64 * g;
        const __m256i lo = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(run)), flip);
        const __m256i hi = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(run + 32)), flip);
        const __m256i lo_codes = S == 8 ? lo : _mm256_and_si256(_mm256_srli_epi16(lo, S * j), mask);
        const __m256i hi_codes = S == 8 ? hi : _mm256_and_si256(_mm256_srli_epi16(hi, S * j), mask);
        for (int i = 0; i < 4; ++i) {
          float* row = panel + (k0 + i) * 16;
          if (k0 + i >= K) {  // k past K
            _mm256_storeu_ps(row, _mm256_setzero_ps());
            _mm256_storeu_ps(row + 8, _mm256_setzero_ps());
            continue;
          }
          const __m256 q0 = _mm256_cvtepi32_ps(dword_byte(lo_codes, i)),
                       q1 = _mm256_cvtepi32_ps(dword_byte(hi_codes, i));
          _mm256_storeu_ps(row, _mm256_mul_ps(_mm256_sub_ps(q0, zp0), scale0));
          _mm256_storeu_ps(row + 8, _mm256_mul_ps(_mm256_sub_ps(q1, zp1), scale1));
        }
      }
  }
}

void nbits_panel_from_packed(const NBitsWeight& w, int64_t n0, uint8_t* panel) {
  const int64_t kb = w.k_blocks, bs = w.block_size, S = quads_storage_bits(w.bits), Q = 8 / S;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << S) - 1));
  const uint8_t* codes = quads_panel_codes(w, n0 / kPanel);
  for (int64_t g = 0; g < kb * bs / 4 / Q; ++g)
    for (int64_t half = 0; half < 2; ++half) {
      const __m256i packed_codes = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 64 * g + 32 * half));
      for (int64_t j = 0; j < Q; ++j) {
        const __m256i quad =
            S == 8 ? packed_codes : _mm256_and_si256(_mm256_srli_epi16(packed_codes, static_cast<int>(S * j)), mask);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (g * Q + j) * 64 + 32 * half), quad);
      }
    }
}

}  // namespace avx2
}  // namespace qmm
