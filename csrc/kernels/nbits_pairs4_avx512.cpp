// nbits_pairs4_avx512.cpp: MatMulNBits level 3's bfloat16 pair panels for 4-bit codes, straight from the codes through per-block tables (the bf16 entries' prefill).
//
// The fast path of nbits_pair_panel32 (nbits_f32_avx512.cpp), in the avx512_vnni build (natively and
// over SIMDe, QMM_EMULATED), whose panels the avx512bf16 and amxbf16 entries' pair kernels read.
#include "avx512_intrinsics.h"

#include <cmath>
#include <cstdint>

#include "matmul_nbits.h"
#include "nbits_avx2_common.h"
#include "nbits_f32_avx512.h"

namespace qmm {
namespace {

#include "transpose16_avx512.inc"

// float32(q - z) for the codes q = 0 .. 15 of each integer zero point z.
struct CodesLess {
  alignas(64) float row[256][16];  // row[z][q] = q - z
};
constexpr CodesLess make_codes_less() {
  CodesLess t{};
  for (int z = 0; z < 256; ++z)
    for (int q = 0; q < 16; ++q) t.row[z][q] = static_cast<float>(q - z);
  return t;
}
constexpr CodesLess kCodesLess = make_codes_less();

// Whether x[0 .. count) are all finite.
inline bool all_finite(const float* x, int64_t count) {
  const __m512i exponent = _mm512_set1_epi32(0x7F800000);
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= count; i += 16)
    bad = static_cast<__mmask16>(
        bad | _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i), exponent), exponent));
  for (; i < count; ++i) bad = static_cast<__mmask16>(bad | !std::isfinite(x[i]));
  return bad == 0;
}

}  // namespace

// Level 3's pair panels for 4-bit codes in blocks of 32 or more without a g_idx, straight from the
// codes: a 4-bit row holds pair j (k = 2j, 2j + 1) in its byte j, low nibble first, which is the
// pair word's order. Per column and block a table of the 16 bfloat16 weights (the floats of
// build_pair_panels, rounded the same way), then per 16 bytes of a column: each byte into both
// words of a dword, the high word's shifted right by 4, and one vpermw through the table (which
// reads an index's low 5 bits: the table's words 16-31 repeat 0-15, so the bits above a nibble
// need no mask) gives the 16 pair words; 16 columns' words, transposed, are 16 rows of the panel.
// No float staging (build_pair_panels writes and rereads 64 KB per column). False, with nothing
// written, where a scale or a float zero point is not finite (a weight could be NaN, which the
// integer rounding does not keep a NaN): build_pair_panels then does it.
bool QMM_KERNEL_NS::nbits_pair_panel32_4bit(const NBitsWeight& w, int64_t n, int64_t cols, uint32_t* pairs) {
  const int64_t K = w.K, KP = (K + 1) / 2, bs = w.block_size, halves = cols > 16 ? 2 : 1;
  for (int64_t c = 0; c < cols; ++c)
    if (!all_finite(w.scales + (n + c) * w.k_blocks, w.k_blocks) ||
        (!w.zero_points_u8 && !all_finite(w.zero_points + (n + c) * w.k_blocks, w.k_blocks)))
      return false;
  const __m512i round = _mm512_set1_epi32(0x7FFF);
  // A table's words: the high word of each rounded float (its bfloat16), twice
  const __m512i high_words = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27, 25,
                                              23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  // Byte j of a 16-byte run into both words of dword j (vpshufb, per 128-bit lane of the run
  // broadcast), then the high word shifted right by 4.
  const __m512i spread = _mm512_set_epi8(-128, 15, -128, 15, -128, 14, -128, 14, -128, 13, -128, 13, -128, 12, -128, 12,
                                         -128, 11, -128, 11, -128, 10, -128, 10, -128, 9, -128, 9, -128, 8, -128, 8,
                                         -128, 7, -128, 7, -128, 6, -128, 6, -128, 5, -128, 5, -128, 4, -128, 4, -128,
                                         3, -128, 3, -128, 2, -128, 2, -128, 1, -128, 1, -128, 0, -128, 0);
  const __m512i nibble_shift = _mm512_set1_epi32(0x00040000);
  for (int64_t h = 0; h < halves; ++h) {
    const int64_t count = min_i64(16, cols - 16 * h);
    uint32_t* panel = pairs + h * KP * 16;
    for (int64_t b = 0; b * (bs / 2) < KP; ++b) {
      __m512i table[16];  // column c's 16 weights of block b, bfloat16, in words 0-15 and again 16-31
      for (int64_t c = 0; c < count; ++c) {
        const int64_t index = (n + 16 * h + c) * w.k_blocks + b;
        // float32(q - z) for q = 0 .. 15: for an integer zero point (0 .. 255), one of kCodesLess's rows
        const __m512 q_less_z =
            w.zero_points_u8 ? _mm512_load_ps(kCodesLess.row[w.zero_points_u8[index]])
                             : _mm512_sub_ps(_mm512_load_ps(kCodesLess.row[0]), _mm512_set1_ps(w.zero_points[index]));
        const __m512i bits = _mm512_castps_si512(_mm512_mul_ps(q_less_z, _mm512_set1_ps(w.scales[index])));
        // nearest even: round_operands' bfloat16 arithmetic (finite values)
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        table[c] = _mm512_permutexvar_epi16(high_words, _mm512_add_epi32(_mm512_add_epi32(bits, round), lsb));
      }
      const int64_t j_end = min_i64((b + 1) * (bs / 2), KP);
      for (int64_t j0 = b * (bs / 2); j0 < j_end; j0 += 16) {
        __m512 r[16];
        for (int64_t c = 0; c < 16; ++c) {
          if (c >= count) {
            r[c] = _mm512_setzero_ps();
            continue;
          }
          const uint8_t* row = w.codes + (n + 16 * h + c) * w.row_bytes + j0;
          const __m512i run = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
          const __m512i index = _mm512_srlv_epi16(_mm512_shuffle_epi8(run, spread), nibble_shift);
          r[c] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(index, table[c]));
        }
        transpose16(r);  // r[t]: pair j0 + t of the 16 columns
        for (int64_t t = 0; t < 16 && j0 + t < KP; ++t) {
          __m512i words = _mm512_castps_si512(r[t]);
          if (2 * (j0 + t) + 1 == K) words = _mm512_and_si512(words, _mm512_set1_epi32(0xFFFF));  // k = K: 0
          _mm512_storeu_si512(panel + (j0 + t) * 16, words);
        }
      }
    }
  }
  return true;
}

}  // namespace qmm
