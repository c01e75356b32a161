// nbits_packed_avx512vnni.cpp: AVX-512 VNNI MatMulNBits level 4 on a weight packed once in the "quads x16" layout (kNBitsQuads16, matmul_nbits.h): the few-row kernel (the avx512_vnni and AMX tables below 8 rows).
//
// Each 64-byte run of the layout is one zmm: a shift and a mask (8-bit codes: an xor with 0x80)
// give one quad of codes of the panel's 16 columns as bytes, and one broadcast of four int8 of A
// meets them in vpdpbusd (uint8 codes x int8 qa, exact in int32 for every width): each column's
// block sum comes out in its own int32 lane, with no reduction across lanes (the per-column kernel
// of nbits_int8_avx512vnni.cpp folds eight blocks' 16-lane sums with shuffles, per column). Codes
// past K meet qa = 0, whatever they hold.
//
// The float32 epilogue is the few-row order of docs/matmul_nbits.md ("Float32 order of level 4":
// lane i of the AVX2 row-wise kernel's vectors takes blocks b = i mod 8; then the blocks left
// over), here one vector per residue with the columns in the lanes, so the results are those of
// the unpacked kernels and of the AVX2 table bit for bit (tests/test_nbits_packed.py). Built twice
// like nbits_int8_avx512vnni.cpp: natively and over SIMDe (QMM_EMULATED).
#include "avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "matmul_nbits.h"
#include "nbits_avx2_common.h"
#include "nbits_avx512vnni.h"

namespace qmm {
namespace {

constexpr int64_t kPanel = kQuadsPanel;
// Rows per pass from 8 rows of M (in the GEMM's order), for 2- and 4-bit storage: one shift and mask
// of a quad's codes serves 8 rows (Zen 4, 4-bit K = N = 4096, 2 threads, 4-row / 8-row passes:
// blocks of 128 1.04-1.12 at 8-128 rows, 1.13-1.15 at 1 thread; blocks of 32 0.98-1.05). 8-bit
// storage keeps passes of 4 (8-bit codes 6-10 % slower in passes of 8).
constexpr int kInOrderRows = 8;

// The row-wise kernels' horizontal_sum with the lanes in 8 vectors: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
inline __m512 lane_sums(const __m512 v[8]) {
  const __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
  const __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
  return _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
}

// Rows m0 .. m0+MR-1 of A against panel p (16 columns). S: the codes' width in the layout; Eight:
// 8-bit codes (held as c ^ 0x80); Groups: groups of 8 / S quads per block when known at compile
// time (0: at run time). InOrder: the float32 order of 8+ rows (the GEMM's: per output, blocks in
// order, y = fma(D, p, y) then y = fnmadd(block_sum, sb * zp, y)); else that of fewer rows
// (residues mod 8, then the blocks left over).
template <int S, bool Eight, int MR, int Groups, bool InOrder>
void panel_rows(const QuantizedA& a, int64_t m0, const NBitsWeight& w, int64_t p, const QuadsPanel& panel,
                const float* bias, float* Y) {
  constexpr int Q = 8 / S;
  // One or two rows leave a block's vpdpbusd one dependent chain per row (8 of them at 4 bits and
  // blocks of 32, 32 at blocks of 128): two chains, the quads alternating, keep the unit busy. The
  // chains' int32 sums add exactly, so the bits are the same. (Zen 4, 4-bit K = N = 4096, 1-2
  // threads, in-process A/B: one row blocks of 128 1.11-1.16x, of 32 1.01-1.05x; two rows up to
  // 1.21x; three rows 0.93-0.97x, so not there.)
  constexpr int P = MR <= 2 && Q % 2 == 0 && !InOrder ? 2 : 1;
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, bytes = quads_block_bytes(w);
  const int64_t groups = Groups ? Groups : bs / 4 / Q;
  const QuadsPrefetchL2 prefetch(w);
  const uint8_t* codes = panel.codes;
  const float* sb_panel = panel.scales;
  const int8_t* qa[MR];
  for (int r = 0; r < MR; ++r) qa[r] = a.qa + (m0 + r) * padded;
  const float* scale_a = a.scale + m0 * kb;
  const float* block_sum = a.block_sum + m0 * kb;
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << S) - 1)), flip = _mm512_set1_epi8(-128);
  __m512 acc[MR][8], correction[MR][8], y[MR];
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < 8; ++i) acc[r][i] = correction[r][i] = _mm512_setzero_ps();
  const int64_t whole = InOrder ? 0 : kb / 8 * 8;
  if constexpr (InOrder)
    for (int r = 0; r < MR; ++r) y[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    if (!InOrder && b == whole)
      for (int r = 0; r < MR; ++r) y[r] = _mm512_sub_ps(lane_sums(acc[r]), lane_sums(correction[r]));
    __m512i dot[P][MR];
    for (int i = 0; i < P; ++i)
      for (int r = 0; r < MR; ++r) dot[i][r] = _mm512_setzero_si512();
    // 8-bit codes in the GEMM's order take the GEMM's integers: (qa + 128) as uint8 times c - 128
    // as stored, plus -128 * sum (c - 128) per column (column_sum: the codes against ones), which is
    // sum qa (c - 128) exactly; its zero-point term is then scale * (zero point - 128).
    constexpr bool kGemmIntegers = Eight && InOrder;
    __m512i column_sum = _mm512_setzero_si512();
    const uint8_t* block = codes + b * bytes;
    prefetch(panel, b);
    for (int64_t g = 0; g < groups; ++g) {
      const __m512i run = _mm512_load_si512(reinterpret_cast<const void*>(block + 64 * g));
      for (int j = 0; j < Q; ++j) {
        __m512i quad;
        if constexpr (kGemmIntegers) quad = run;
        else if constexpr (Eight) quad = _mm512_xor_si512(run, flip);  // c - 128 back to c
        else if constexpr (S == 8) quad = run;
        else quad = _mm512_and_si512(j ? _mm512_srli_epi16(run, S * j) : run, mask);
        const int64_t k = b * bs + 4 * (g * Q + j);
        if constexpr (kGemmIntegers) column_sum = _mm512_dpbusd_epi32(column_sum, _mm512_set1_epi8(1), quad);
        const int part = j % P;  // compile-time: the loop over j unrolls
        for (int r = 0; r < MR; ++r) {
          int32_t four;
          std::memcpy(&four, qa[r] + k, 4);
          __m512i& d = dot[part][r];
          if constexpr (kGemmIntegers)  // qa + 128 = qa ^ 0x80 per byte (qa is never -128)
            d = _mm512_dpbusd_epi32(d, _mm512_set1_epi32(four ^ static_cast<int32_t>(0x80808080u)), quad);
          else d = _mm512_dpbusd_epi32(d, quad, _mm512_set1_epi32(four));
        }
      }
    }
    for (int i = 1; i < P; ++i)
      for (int r = 0; r < MR; ++r) dot[0][r] = _mm512_add_epi32(dot[0][r], dot[i][r]);
    if constexpr (kGemmIntegers) {
      const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(column_sum, 7));
      for (int r = 0; r < MR; ++r) dot[0][r] = _mm512_add_epi32(dot[0][r], start);
    }
    const __m512 sb = _mm512_load_ps(sb_panel + b * kPanel);
    // scale * zero point, formed here from the panel's uint8 or float zero points (one float32 product).
    // (uint8 -> uint16 -> int32: SIMDe has no _mm512_cvtepu8_epi32)
    const __m512 zp = panel.zero_points ? _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_cvtepu8_epi16(_mm_load_si128(
                                              reinterpret_cast<const __m128i*>(panel.zero_points + b * kPanel)))))
                                        : _mm512_load_ps(panel.float_zero_points + b * kPanel);
    const __m512 szp = _mm512_mul_ps(sb, kGemmIntegers ? _mm512_sub_ps(zp, _mm512_set1_ps(128.0f)) : zp);
    for (int r = 0; r < MR; ++r) {
      const __m512 product = _mm512_mul_ps(_mm512_set1_ps(scale_a[r * kb + b]), sb);
      const __m512 total = _mm512_cvtepi32_ps(dot[0][r]), bsum = _mm512_set1_ps(block_sum[r * kb + b]);
      if constexpr (InOrder) {
        y[r] = _mm512_fnmadd_ps(bsum, szp, _mm512_fmadd_ps(total, product, y[r]));
      } else if (b < whole) {
        acc[r][b % 8] = _mm512_fmadd_ps(total, product, acc[r][b % 8]);
        correction[r][b % 8] = _mm512_fmadd_ps(bsum, szp, correction[r][b % 8]);
      } else {  // y + ((p * D) - block_sum * (sb * zp)), rounded step by step
        y[r] = _mm512_add_ps(y[r], _mm512_sub_ps(_mm512_mul_ps(product, total), _mm512_mul_ps(bsum, szp)));
      }
    }
  }
  if (!InOrder && whole == kb)
    for (int r = 0; r < MR; ++r) y[r] = _mm512_sub_ps(lane_sums(acc[r]), lane_sums(correction[r]));
  const int64_t n0 = p * kPanel, cols = min_i64(kPanel, w.N - n0);
  for (int r = 0; r < MR; ++r) {
    float* row = Y + (m0 + r) * w.N + n0;
    if (cols == kPanel) {  // straight from the register (the copy below was a memcpy call per row)
      _mm512_storeu_ps(row, bias ? _mm512_add_ps(y[r], _mm512_loadu_ps(bias + n0)) : y[r]);
      continue;
    }
    alignas(64) float out[16];
    _mm512_store_ps(out, y[r]);
    for (int64_t c = 0; c < cols; ++c) row[c] = bias ? out[c] + bias[n0 + c] : out[c];
  }
}

template <int S, bool Eight, int Groups>
void panels_rows(const QuantizedA& a, const NBitsWeight& w, int64_t p0, int64_t p1, const float* bias, float* Y) {
  auto body = [&](auto mr, auto in_order, int64_t p, int64_t m0) {
    panel_rows<S, Eight, decltype(mr)::value, Groups, decltype(in_order)::value>(a, m0, w, p, quads_panel(w, p), bias,
                                                                                 Y);
  };
  quads_row_passes<(S < 8 ? kInOrderRows : 4)>(a.M, p0, p1, body);
}

// Blocks of 32 codes (the usual size) with a compile-time group count.
template <int S, bool Eight = false>
void panels_rows_sized(const QuantizedA& a, const NBitsWeight& w, int64_t p0, int64_t p1, const float* bias, float* Y) {
  if (w.block_size == 32) return panels_rows<S, Eight, S>(a, w, p0, p1, bias, Y);  // 8 quads: S groups of 8 / S
  panels_rows<S, Eight, 0>(a, w, p0, p1, bias, Y);
}

}  // namespace

namespace QMM_KERNEL_NS {

void nbits_rows_int8_packed(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                            float* Y) {
  const int64_t p0 = n0 / kPanel, p1 = (n1 + kPanel - 1) / kPanel;  // n0: a multiple of the panel (the driver's tasks)
  if (w.bits == 8) return panels_rows_sized<8, true>(a, w, p0, p1, bias, Y);
  switch (quads_storage_bits(w.bits)) {
    case 2: return panels_rows_sized<2>(a, w, p0, p1, bias, Y);
    case 4: return panels_rows_sized<4>(a, w, p0, p1, bias, Y);
    default: return panels_rows_sized<8>(a, w, p0, p1, bias, Y);
  }
}

void nbits_panel16_from_packed(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel) {
  const int64_t kb = w.k_blocks, bs = w.block_size, bytes = quads_block_bytes(w), S = quads_storage_bits(w.bits);
  const int64_t Q = 8 / S;
  const uint8_t* codes = quads_panel_codes(w, n0 / kPanel);
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << S) - 1));
  // The panel's columns from cols on are zero (as nbits_decode_panel16 writes them): 4 bytes each.
  alignas(64) int32_t keep_lanes[16];
  for (int c = 0; c < 16; ++c) keep_lanes[c] = c < cols ? -1 : 0;
  const __m512i keep = _mm512_load_si512(reinterpret_cast<const void*>(keep_lanes));
  for (int64_t k = k0; k < k1; k += 4) {
    const int64_t b = k / bs, quad = (k % bs) / 4;
    const __m512i run = _mm512_load_si512(reinterpret_cast<const void*>(codes + b * bytes + 64 * (quad / Q)));
    const int shift = static_cast<int>(S * (quad % Q));
    const __m512i codes_of_quad =
        S == 8 ? run : _mm512_and_si512(_mm512_srl_epi16(run, _mm_cvtsi32_si128(shift)), mask);
    _mm512_storeu_si512(panel + (k - k0) / 4 * 64, _mm512_and_si512(codes_of_quad, keep));
  }
  for (int64_t k = k1; k < k0 + (k1 - k0 + 63) / 64 * 64; k += 4)  // the rounding up to 64: zeros
    _mm512_storeu_si512(panel + (k - k0) / 4 * 64, _mm512_setzero_si512());
}

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
