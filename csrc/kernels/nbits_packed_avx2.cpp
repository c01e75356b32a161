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

namespace qmm {
namespace {

constexpr int64_t kPanel = kQuadsPanel;

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
void panel_rows(const QuantizedA& a, int64_t m0, const NBitsWeight& w, int64_t p, int64_t steps, const int32_t* qa_sums,
                const float* bias, float* Y) {
  constexpr int Q = 8 / S;
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, bytes = quads_block_bytes(w);
  const int64_t groups = Groups ? Groups : bs / 4 / Q;
  const QuadsPanel panel = quads_panel(w, p);
  const uint8_t* codes = panel.codes;
  const float *sb_panel = panel.scales, *szp_panel = panel.scaled_zero_points;
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
    int32_t sums[MR];
    if constexpr (Signed8)
      for (int r = 0; r < MR; ++r) sums[r] = qa_sums[(m0 + r) * kb + b];
    __m256i dot[MR][2];
    block_sums<S, Signed8, MR>(codes + b * bytes, qa, b * bs, groups, steps, sums, dot);
    for (int h = 0; h < 2; ++h) {
      const __m256 sb = _mm256_load_ps(sb_panel + b * kPanel + 8 * h);
      const __m256 szp = _mm256_load_ps(szp_panel + b * kPanel + 8 * h);
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
  auto pass = [&](auto in_order) {
    constexpr bool InOrder = decltype(in_order)::value;
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
        switch (min_i64(4, a.M - m0)) {
          case 1: panel_rows<S, Signed8, 1, Groups, InOrder>(a, m0, w, p, steps, qa_sums, bias, Y); break;
          case 2: panel_rows<S, Signed8, 2, Groups, InOrder>(a, m0, w, p, steps, qa_sums, bias, Y); break;
          case 3: panel_rows<S, Signed8, 3, Groups, InOrder>(a, m0, w, p, steps, qa_sums, bias, Y); break;
          default: panel_rows<S, Signed8, 4, Groups, InOrder>(a, m0, w, p, steps, qa_sums, bias, Y);
        }
      }
  };
  if (a.M >= kInt8GemmMinRows) pass(std::true_type{});  // from there, the GEMM's order
  else pass(std::false_type{});
}

// Blocks of 32 codes (the usual size) with a compile-time group count.
template <int S, bool Signed8>
void panels_rows_sized(const QuantizedA& a, const NBitsWeight& w, int64_t p0, int64_t p1, const int32_t* qa_sums,
                       const float* bias, float* Y) {
  if (w.block_size == 32) return panels_rows<S, Signed8, 8 / (8 / S)>(a, w, p0, p1, qa_sums, bias, Y);
  panels_rows<S, Signed8, 0>(a, w, p0, p1, qa_sums, bias, Y);
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

void nbits_panel_from_packed(const NBitsWeight& w, int64_t n0, uint8_t* panel) {
  const int64_t kb = w.k_blocks, bs = w.block_size, S = quads_storage_bits(w.bits), Q = 8 / S;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << S) - 1));
  const uint8_t* codes = quads_panel(w, n0 / kPanel).codes;
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
