// qgemm.h: the 8-bit integer GEMM family: packed layouts, the kernel interface, and the packers (csrc/pack.cpp).
//
// A packed layout is described by a QGemmLayout; every table of the family names the one its kernel
// reads, and every packed buffer records the id it was packed with (csrc/qlinear_matmul.h).
//
//   packed A: groups of `mr` rows, a_row_int32s(K) int32s per row: rows [r0, r0 + mr) at
//             r0 * a_row_int32s(K) (r0 a multiple of mr); in a group, for each k-group g (kc
//             consecutive k), mr * a_int32s int32s holding the group's kc values of k-group g (how:
//             below), or row-major (kLayoutQuads); K padded to whole k-groups with zeros, and the
//             last group's rows past the matrix zero where a kernel reads them (pairs, tiles).
//   packed B: panels of `nr` columns; in a panel, for each k-group g, nr * kc bytes (how: below);
//             zero padded past K and N.
//
// The three layouts so far:
//   kLayoutPairs (portable, AVX2): kc = 2; A holds one int32 per row (a_int32s = 1) of two int16
//             (a[r,2g] low half, a[r,2g+1] high),
//             B two bytes of b's own signedness per column; mr = 4, nr = 16. vpmaddwd on int16
//             pairs is exact for every signedness combination.
//   kLayoutQuads (AVX-512 VNNI): kc = 4; A holds four uint8 and B four int8 per column, each value
//             stored with an offset (signed a + 128, unsigned b - 128) so that vpdpbusd's
//             uint8 x int8 products are exact; mr = 8, nr = 32. The offsets become zero-point terms:
//             (a - za)(b - zb) = (a' - (za + oa))(b' - (zb + ob)), docs/quantization.md. uint8 a x
//             int8 b, the common pair, is stored as given. A is row-major (a_int32s = 1): k-group g
//             of row r at r * k_groups(K) + g, which is an unsigned a itself where K is a multiple
//             of 4 (the driver reads it in place, unpacked); a panel's k-group is 128 bytes, column
//             j's four bytes at 4j.
//   kLayoutTiles (AMX-INT8): the values and offsets of kLayoutQuads (tdpbusd: uint8 A x int8 B), in
//             tiles: kc = 64, mr = 32, nr = 32. A: per k-group, a 32 x 64-byte row-major block
//             (row r's 64 bytes at 64r; a_int32s = 16), so that two A tiles of 16 rows load at
//             stride 64. B: a panel's k-group is 16 k-quads of 128 bytes, each exactly a
//             kLayoutQuads k-group (column j's four bytes at 4j): kLayoutQuads' panel with K padded
//             to a multiple of 64, whose halves of 16 columns load as B tiles at stride 128.
// Stored values are 0 in padding, so padded k contribute nothing to the raw sums.
#pragma once

#include <cstdint>

#include "cpu_features.h"

namespace qmm {

enum LayoutId : int32_t { kLayoutPairs = 1, kLayoutQuads = 2, kLayoutTiles = 3 };

struct QGemmLayout {
  LayoutId id;
  const char* name;
  int64_t mr, nr, kc;  // rows per A group, columns per B panel, k values per k-group
  int64_t a_int32s;    // packed A's int32s per row and k-group: a group of mr rows takes mr * a_int32s per k-group
  // stored = value + offset, by the operand's signedness: [0] unsigned, [1] signed.
  int32_t a_offset[2], b_offset[2];
  // The driver's blocking for this tile shape (csrc/qlinear_matmul.cpp): rows of A per task (a
  // multiple of mr), the bytes of B panels per task, and k per kernel call (the kernels add into C
  // between calls).
  int64_t task_rows, task_panel_bytes, k_block;
  // A is row-major with its rows' k-groups contiguous (a_int32s = 1): an A stored as given (no
  // offset) with K a multiple of kc is its own packed form, which the driver reads in place.
  bool a_row_major;

  int64_t k_groups(int64_t K) const { return (K + kc - 1) / kc; }
  int64_t n_panels(int64_t N) const { return (N + nr - 1) / nr; }
  int64_t panel_bytes(int64_t K) const { return k_groups(K) * kc * nr; }
  int64_t packed_b_bytes(int64_t K, int64_t N) const { return n_panels(N) * panel_bytes(K); }
  // Packed A's int32s per row: rows [r0, r0 + mr) (r0 a multiple of mr) start at r0 * a_row_int32s(K).
  int64_t a_row_int32s(int64_t K) const { return k_groups(K) * a_int32s; }
  int64_t packed_a_int32s(int64_t rows, int64_t K) const { return (rows + mr - 1) / mr * mr * a_row_int32s(K); }
};

extern const QGemmLayout kPairsLayout;
extern const QGemmLayout kQuadsLayout;
extern const QGemmLayout kTilesLayout;

// Packs rows [0, rows) of a row-major 8-bit matrix with row stride lda (packed A, above).
using PackA = void (*)(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed);
// Packs panels [panel0, panel1) of a row-major 8-bit [K, N] matrix into out (panel0 first), and
// writes colsum[n] = sum_k b[k, n] (the values as given, without the layout's offset) for their columns.
using PackBPanels = void (*)(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1,
                             int8_t* out, int32_t* colsum);

void pack_a_pairs(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed);
void pack_b_pairs(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                  int32_t* colsum);
void pack_a_quads(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed);
void pack_b_quads(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                  int32_t* colsum);
void pack_a_tiles(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed);
void pack_b_tiles(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                  int32_t* colsum);

// C[r, j] = sum over k-groups [g0, g1) of the stored values of rows [0, rows) of the packed A group
// at a times the nr columns of the B panel at b_panel. rows <= mr; lda is A's a_row_int32s(K), the
// int32s from one row to the next (the row-major layout reads its rows there; the others' groups
// are contiguous); b_signed is b's signedness as given (for layouts that store it). C is row-major
// with row stride ldc (int32, wrapping: exact while the sum fits, which the driver ensures by
// chunking k).
using QGemmKernel = void (*)(const int32_t* a, int64_t lda, int64_t rows, const int8_t* b_panel, int64_t g0, int64_t g1,
                             bool b_signed, bool accumulate, int32_t* c, int64_t ldc);

// The same sums for an A read in place through a table of receptive fields (a convolution's, without
// an im2col; kLayoutQuads only, uint8 a stored as given): rows [0, rows) of the table offsets
// ([rows][taps] int32, row stride taps), row r's k-quads for tap t being the K / (4 taps) int32s at
// x + offsets[r * taps + t] (bytes), or at pad where that offset is negative; the panel's k-quads in
// the order of the taps, then the quads. All of K in one call; C written, not added to.
using QGemmTapsKernel = void (*)(const uint8_t* x, const int32_t* offsets, int64_t taps, const uint8_t* pad,
                                 int64_t rows, int64_t quads_per_tap, const int8_t* b_panel, int32_t* c, int64_t ldc);

// A product of 8-bit matrices with K <= kSmallProductMaxK and cols <= kSmallProductMaxCols, read in
// place (no packing) and returned as final sums, the zero-point terms included: c[r * ldc + j] =
// sum_k (a[r * lda + k] - za[r]) * (b[k * ldb + j] - zb[j]) for r < rows, j < cols, k < K, a and b
// each int8 or uint8, every zero point in its operand's range (exact in int32). Writes c only there.
// AVX2 and portable: the differences as int16 (vpmaddwd); AVX-512: the bytes on vpdpbusd with the row
// and column sums formed in the kernel (docs/quantization.md). None of the packed kernels' per-call
// packing of b and its terms, which outweigh attention's products of a few thousand multiply-adds.
constexpr int64_t kSmallProductMaxK = 128, kSmallProductMaxCols = 64;
using QGemmSmallProduct = void (*)(const void* a, bool a_signed, int64_t lda, const int32_t* za, const void* b,
                                   bool b_signed, int64_t ldb, const int32_t* zb, int64_t rows, int64_t K, int64_t cols,
                                   int32_t* c, int64_t ldc);

// One output row's zero-point terms in the layout's stored values (docs/quantization.md, csrc/qlinear_matmul.cpp):
// acc[j] = raw[j] - zb[j] * t - za * colsum[j] (raw[j] - t - za * colsum[j] where zb is null), in
// wrapping int32 arithmetic.
struct RowTerms {
  const int32_t* zb;      // per column: zb' = b's zero point + the layout's b offset; null where all are one value
  const int32_t* colsum;  // per column: colsum(b) + K * b offset (times za', where za is 1)
  // za: a's zero point + a offset (1 where colsum holds the product); t: the row's term rowsum(a) + K *
  // a offset - K * za', which each column multiplies by its zb', or, where zb is null, that product
  // already (every column's zb' alike; 0 where they are 0). acc = raw - zb' * t - za * colsum.
  int32_t za, t;
};

// acc[j] of a row: its raw kernel sum with the row's zero-point terms.
static inline int32_t row_terms_applied(const int32_t* raw, const RowTerms& terms, int64_t j) {
  const uint32_t zb = terms.zb ? static_cast<uint32_t>(terms.zb[j]) : 1;
  const uint32_t wrapped = static_cast<uint32_t>(raw[j]) - zb * static_cast<uint32_t>(terms.t) -
                           static_cast<uint32_t>(terms.za) * static_cast<uint32_t>(terms.colsum[j]);
  return static_cast<int32_t>(wrapped);
}
// The ONNX Runtime epilogue of csrc/requantize.h, vectorized, for a block's rows at once: y[j] =
// saturate(rne(max/min-clamped(f32(acc[j]) * multiplier[j])) + zp[j]) for j < count in one pass over
// each row, row r's acc from its raw sums at raw + r * ld and terms[r], its multipliers and zero points
// at multiplier + r * multiplier_ld and zp + r * zp_ld (an ld of 0: one row of them for every row,
// checked once), its output at y + r * ldy.
using RequantizeRows = void (*)(const int32_t* raw, int64_t ld, const RowTerms* terms, int64_t rows,
                                const float* multiplier, int64_t multiplier_ld, const int32_t* zp, int64_t zp_ld,
                                int64_t count, bool y_signed, uint8_t* y, int64_t ldy);

// The packed kernel and that epilogue in one pass, no int32 sums stored (kLayoutQuads: A row-major,
// read in place or packed, lda int32s from one row to the next): rows [0, rows) (<= mr) x columns
// [0, cols) (<= nr) of the B panel at b_panel over k-groups [0, groups), for a block whose rows share
// za' and whose output has no row term (every zb' 0): acc = sum - colterm[j] (wrapping; colterm is
// RowTerms' colsum where za is 1: za' * colsum(b') - bias), y[r * ldy + j] = RequantizeRows' value
// of acc with multiplier[j] and the output zero point zp of every column. Writes y there only.
using QGemmRequantizedKernel = void (*)(const int32_t* a, int64_t lda, int64_t rows, const int8_t* b_panel,
                                        int64_t groups, const int32_t* colterm, const float* multiplier, int32_t zp,
                                        bool y_signed, int64_t cols, uint8_t* y, int64_t ldy);

// The same for an A read through a table of receptive fields (QGemmTapsKernel's x, offsets, taps,
// pad, rows and quads_per_tap): all of K in one call, the block's outputs at y.
using QGemmTapsRequantizedKernel = void (*)(const uint8_t* x, const int32_t* offsets, int64_t taps, const uint8_t* pad,
                                            int64_t rows, int64_t quads_per_tap, const int8_t* b_panel,
                                            const int32_t* colterm, const float* multiplier, int32_t zp, bool y_signed,
                                            int64_t cols, uint8_t* y, int64_t ldy);

// y[r * ldy + n] = sum_k a[r, k] * b[k, n] for rows r < rows and columns n < cols, float32 fused
// multiply-adds in order of k from +0 (kernels/sgemm_rows.inc): the float8 path. b comes in panels
// of 16 columns, [ceil(cols / 16)][K][16], zero padded. a holds the rows interleaved by k in groups
// of the entry's a_group rows (Float8Dispatch, csrc/dispatch.h), as the driver packs them: the
// group of rows [g, g + G) (g a multiple of G; G = a_group, or the rows left for the last group)
// at a + g * K, a[r, k] at a + g * K + k * G + (r - g). With a_group 1 that is a as given, [rows, K].
using SgemmRows = void (*)(const float* a, const float* b, float* y, int64_t ldy, int64_t rows, int64_t cols,
                           int64_t K);

// The float8 path over bfloat16 pairs (Float8Dispatch::pair_rows): a and b as the upper halves of
// their float32 values (exactly the values where pair_exact holds), two consecutive k in each
// 32-bit word: word j holds k = 2j in its low half and k = 2j + 1 in its high half (the pairs of
// vdpbf16ps and tdpbf16ps), the last word's high half 0 when K is odd. KP = ceil(K / 2) words per
// row of a and per column of b. b: panels of 16 columns, [ceil(cols / 16)][KP][16] words, zero
// padded past the last column. a: the groups of rows of SgemmRows in words: the group of rows
// [g, g + G) at a + g * KP, row r's word j at a + g * KP + j * G' + (r - g) (G' the group's rows).
// y[r * ldy + n] = sum_k a[r, k] * b[k, n] in float32, in the entry's order (pair_order;
// docs/quantization.md).
using PairRows = void (*)(const uint32_t* a, const uint32_t* b, float* y, int64_t ldy, int64_t rows, int64_t cols,
                          int64_t K);

// The pair layout's packers (csrc/pack.cpp, baseline code). Each writes every word of its output
// (padding included) and returns whether every value it read is pair-exact: +-0, or a normal
// float32 with 2^-48 <= |x| < 2^48 whose low 16 bits are 0 (so its bfloat16 half is the value).
// Column panel [n0, n0 + 16) of the row-major [K, N] matrix b into panel (KP * 16 words):
bool pack_pair_panel(const float* b, int64_t K, int64_t N, int64_t n0, uint32_t* panel);
// Rows [0, rows) of the row-major [rows, K] matrix a as one group (rows words per k pair):
bool pack_pair_group(const float* a, int64_t rows, int64_t K, uint32_t* group);
// The same for a as 8-bit codes (the float8 path's operand): their values' bfloat16 halves and
// whether each value is pair-exact, per code (codes_for_pairs, once per call), then the words as
// pack_pair_group writes them for those values, without a float32 copy of a.
struct PairCodes {
  uint16_t half[256];
  uint8_t inexact[256];
};
PairCodes codes_for_pairs(const float* table);
bool pack_pair_group_codes(const uint8_t* a, int64_t rows, int64_t K, const PairCodes& codes, uint32_t* group);

}  // namespace qmm
