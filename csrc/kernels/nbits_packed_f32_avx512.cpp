// nbits_packed_f32_avx512.cpp: AVX-512 MatMulNBits levels 0/1 on a weight packed in the "quads x16" layout (kNBitsQuads16): the few-row kernel and the prefill's panel.
//
// Each 64-byte run of the layout is one zmm: per column (dword lane) four k of 8 / S quads. Code i
// of quad j sits at bit 8i + Sj of its lane; one shift brings it to the lane's low bits, and
// vpermps, which reads an index's low 4 bits only, turns it into its float value from a 16-entry
// table (2-bit storage: entry c holds c & 3, so the next quads' bits above the code need no mask);
// 8-bit storage (5- to 8-bit codes): vpshufb moves byte i of each dword to its low byte, vcvtdq2ps
// widens it. One broadcast of a[r][k] per row meets the 16 columns in one FMA. So a k of one row
// and 16 columns costs a shift, a lookup and an FMA (AVX2: two vpshufb, two conversions, two FMAs).
//
// The order is the AVX2 table's (nbits_packed_avx2.cpp; docs/matmul_nbits.md, "Float32 order of
// levels 0/1 on AVX2 and AVX-512"), per output in float32 with every product fused into its sum:
//   dot_b = a[k0] q[k0] + a[k0 + 1] q[k0 + 1] + ... over block b's k in order, from +0;
//   y = fnmadd(asum_b, scale_b * zero_point_b, fma(dot_b, scale_b, y)) for the blocks in order from
//   y = +0 (asum_b: the block's sum of A in order of k from +0); then y + bias,
// so its results are the AVX2 table's bit for bit; without a packed weight (codes as they are) the
// AVX2 code builds the layout's panels per call (the same panels the AVX2 kernel reads).
//
// Built twice like nbits_f32_avx512.cpp: natively with -mavx512f/bw/vl/dq, and over SIMDe
// (QMM_EMULATED) for the tests on AVX2 machines.
#include "avx512_intrinsics.h"

#include <cstdint>

#include "matmul_nbits.h"
#include "nbits_avx2.h"
#include "nbits_avx2_common.h"
#include "nbits_f32_avx512.h"

namespace qmm {
namespace {

constexpr int64_t kPanel = kQuadsPanel;

// vpermps tables: the float value of the code in an index's low 4 bits (4-bit storage), or of its
// low 2 bits (2-bit storage).
alignas(64) constexpr float kNibbleValues[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
alignas(64) constexpr float kCrumbValues[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};

// vpshufb indices: byte i of each dword to the dword's low byte, the rest zero (per 128-bit lane).
#define QMM_DWORD_BYTE(i) i, -1, -1, -1, 4 + i, -1, -1, -1, 8 + i, -1, -1, -1, 12 + i, -1, -1, -1
#define QMM_DWORD_BYTE4(i) {QMM_DWORD_BYTE(i), QMM_DWORD_BYTE(i), QMM_DWORD_BYTE(i), QMM_DWORD_BYTE(i)}
alignas(64) constexpr int8_t kDwordByte[4][64] = {QMM_DWORD_BYTE4(0), QMM_DWORD_BYTE4(1), QMM_DWORD_BYTE4(2),
                                                  QMM_DWORD_BYTE4(3)};
#undef QMM_DWORD_BYTE4
#undef QMM_DWORD_BYTE

// Code I of quad J of a run (8-bit storage: already back to c, not c - 128) as 16 floats.
template <int S, int J, int I>
inline __m512 code_values(__m512i run, __m512 table) {
  if constexpr (S == 8) {
    return _mm512_cvtepi32_ps(_mm512_shuffle_epi8(run, _mm512_load_si512(kDwordByte[I])));
  } else {
    constexpr int kShift = 8 * I + S * J;
    return _mm512_permutexvar_ps(kShift ? _mm512_srli_epi32(run, kShift) : run, table);
  }
}

// The zero points of the panel's 16 columns for block b (float, or uint8 converted), zeros past N.
inline __m512 zero_points16(const QuadsPanel& panel, int64_t b) {
  if (!panel.zero_points) return _mm512_load_ps(panel.float_zero_points + b * kPanel);
  const __m128i z = _mm_load_si128(reinterpret_cast<const __m128i*>(panel.zero_points + b * kPanel));
  return _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_cvtepu8_epi16(z)));  // SIMDe: no epu8_epi32
}
// Scale * zero point of the panel's 16 columns for block b: the scales sb times the zero points
// (one float32 product).
inline __m512 scaled_zero_points16(const QuadsPanel& panel, __m512 sb, int64_t b) {
  return _mm512_mul_ps(sb, zero_points16(panel, b));
}

// One quad J of group g for MR rows and P panels: per k (I), each panel's 16 code values, one
// FMA per row and panel into dot[r][p].
template <int S, int MR, int P, int J, int I>
inline void quad_k(const float* const a[MR], int64_t k, const __m512i run[P], __m512 table, __m512 dot[MR][P]) {
  for (int p = 0; p < P; ++p) {
    const __m512 c = code_values<S, J, I>(run[p], table);
    for (int r = 0; r < MR; ++r) dot[r][p] = _mm512_fmadd_ps(c, _mm512_set1_ps(a[r][k]), dot[r][p]);
  }
  if constexpr (I + 1 < 4) quad_k<S, MR, P, J, I + 1>(a, k + 1, run, table, dot);
}
template <int S, int MR, int P, int J>
inline void group_quads(const float* const a[MR], int64_t k, const __m512i run[P], __m512 table, __m512 dot[MR][P]) {
  quad_k<S, MR, P, J, 0>(a, k, run, table, dot);
  if constexpr (J + 1 < 8 / S) group_quads<S, MR, P, J + 1>(a, k + 4, run, table, dot);
}

// Rows a[0 .. MR) against P panels of the layout with codes S bits wide (Signed8: 8-bit codes held
// as c - 128); asum: the rows' block sums [MR][k_blocks]; Y: row 0's output, columns n0[p] .. of
// panel p.
template <int S, bool Signed8, int MR, int P>
void panel_rows(const float* const a[MR], const float* asum, const QuadsPanel panels[P], const int64_t n0[P],
                const NBitsWeight& w, const float* bias, float* Y) {
  constexpr int Q = 8 / S;
  const int64_t kb = w.k_blocks, bs = w.block_size, bytes = bs * S * 2;  // quads_block_bytes for width S
  const int64_t groups = bs / 4 / Q;
  const __m512 table = _mm512_load_ps(S == 2 ? kCrumbValues : kNibbleValues);
  const __m512i flip = _mm512_set1_epi8(-128);
  __m512 y[MR][P];
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < P; ++p) y[r][p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    __m512 dot[MR][P];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < P; ++p) dot[r][p] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i run[P];
      for (int p = 0; p < P; ++p) {
        run[p] = _mm512_load_si512(panels[p].codes + b * bytes + 64 * g);
        if constexpr (Signed8) run[p] = _mm512_xor_si512(run[p], flip);  // held as c - 128: back to c
      }
      group_quads<S, MR, P, 0>(a, b * bs + 4 * Q * g, run, table, dot);
    }
    for (int p = 0; p < P; ++p) {
      const __m512 sb = _mm512_load_ps(panels[p].scales + b * kPanel);
      const __m512 szp = scaled_zero_points16(panels[p], sb, b);
      for (int r = 0; r < MR; ++r)
        y[r][p] = _mm512_fnmadd_ps(_mm512_set1_ps(asum[r * kb + b]), szp, _mm512_fmadd_ps(dot[r][p], sb, y[r][p]));
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t cols = min_i64(kPanel, w.N - n0[p]);
    alignas(64) float out[MR][16];
    for (int r = 0; r < MR; ++r) _mm512_store_ps(out[r], y[r][p]);
    for (int r = 0; r < MR; ++r) {
      float* row = Y + r * w.N + n0[p];
      for (int64_t c = 0; c < cols; ++c) row[c] = bias ? out[r][c] + bias[n0[p] + c] : out[r][c];
    }
  }
}

// Panels [p0, p1) for rows [0, M) of A (rows: padded to k_blocks * block_size), four panels at a
// time (panel_of(p, slot): panel p, slot 0-3 the room for a panel built on the fly), each in passes
// of up to 4 rows over up to 4 panels at once (1-2 rows) or 2 (3-4 rows): 4 to 8 FMA chains.
template <int S, bool Signed8, class PanelOf>
void panels_rows(const float* rows, const float* asum, int64_t M, const NBitsWeight& w, int64_t p0, int64_t p1,
                 const float* bias, float* Y, PanelOf panel_of) {
  const int64_t padded = w.k_blocks * w.block_size, kb = w.k_blocks;
  for (int64_t p = p0; p < p1; p += 4) {
    const int64_t count = min_i64(4, p1 - p);
    QuadsPanel panels[4];
    int64_t n0[4];
    for (int64_t t = 0; t < count; ++t) {
      panels[t] = panel_of(p + t, static_cast<int>(t));
      n0[t] = (p + t) * kPanel;
    }
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t pass = min_i64(4, M - m0), width = pass <= 2 ? 4 : 2;
      const float* a[4];
      for (int r = 0; r < 4; ++r) a[r] = rows + min_i64(m0 + r, M - 1) * padded;
      const float* s = asum + m0 * kb;
      float* y = Y + m0 * w.N;
      for (int64_t t = 0; t < count;) {
        const int64_t n = count - t >= width ? width : 1;
        const QuadsPanel* at = panels + t;
        const int64_t* n0_at = n0 + t;
        switch (pass * 8 + n) {
          case 8 + 4: panel_rows<S, Signed8, 1, 4>(a, s, at, n0_at, w, bias, y); break;
          case 8 + 1: panel_rows<S, Signed8, 1, 1>(a, s, at, n0_at, w, bias, y); break;
          case 16 + 4: panel_rows<S, Signed8, 2, 4>(a, s, at, n0_at, w, bias, y); break;
          case 16 + 1: panel_rows<S, Signed8, 2, 1>(a, s, at, n0_at, w, bias, y); break;
          case 24 + 2: panel_rows<S, Signed8, 3, 2>(a, s, at, n0_at, w, bias, y); break;
          case 24 + 1: panel_rows<S, Signed8, 3, 1>(a, s, at, n0_at, w, bias, y); break;
          case 32 + 2: panel_rows<S, Signed8, 4, 2>(a, s, at, n0_at, w, bias, y); break;
          default: panel_rows<S, Signed8, 4, 1>(a, s, at, n0_at, w, bias, y);
        }
        t += n;
      }
    }
  }
}

}  // namespace

namespace QMM_KERNEL_NS {

void nbits_rows_packed_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* Y) {
  // Four panels built at a time (by the AVX2 code) for the codes as they are.
  quads_rows_f32(A, M, w, n0, n1, 4, avx2::nbits_rows_panel,
                 [&](auto s, auto signed8, const float* rows, const float* asum, int64_t p0, int64_t p1, auto panel) {
                   panels_rows<decltype(s)::value, decltype(signed8)::value>(rows, asum, M, w, p0, p1, bias, Y, panel);
                 });
}

void nbits_dequantize_packed32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel) {
  const int64_t K = w.K, K16 = (K + 15) / 16 * 16, bs = w.block_size, bytes = quads_block_bytes(w);
  const int S = static_cast<int>(quads_storage_bits(w.bits)), Q = 8 / S;
  const __m512i mask = _mm512_set1_epi32((1 << S) - 1);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(w.bits == 8 ? 0x80 : 0));  // 8-bit: held as c - 128
  for (int64_t h = 0; h * kPanel < cols; ++h) {
    const int64_t n0 = n + h * kPanel;
    const QuadsPanel data = quads_panel(w, n0 / kPanel);  // scales and zero points 0 past N: (q - 0) * 0
    const uint8_t* const codes = data.codes;
    for (int64_t b = 0; b * bs < K16; ++b) {
      const __m512 vzp = zero_points16(data, b), vscale = _mm512_load_ps(data.scales + b * kPanel);
      for (int64_t g = 0; g < bs / 4 / Q; ++g) {
        const __m512i run = _mm512_xor_si512(_mm512_load_si512(codes + b * bytes + 64 * g), flip);
        for (int j = 0; j < Q; ++j)
          for (int i = 0; i < 4; ++i) {
            const int64_t k = b * bs + 4 * (g * Q + j) + i;
            if (k >= K16) break;
            float* row = panel + k * kNBitsF32PrefillColumns + h * kPanel;
            if (k >= K) {  // k past K
              _mm512_store_ps(row, _mm512_setzero_ps());
              continue;
            }
            const __m512i q = S == 8 ? _mm512_shuffle_epi8(run, _mm512_load_si512(kDwordByte[i]))
                                     : _mm512_and_si512(_mm512_srlv_epi32(run, _mm512_set1_epi32(8 * i + S * j)), mask);
            _mm512_store_ps(row, _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(q), vzp), vscale));
          }
      }
    }
  }
}

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
