// qgemm.h: the 8-bit integer GEMM kernel interface: packed operand layouts and one kernel table per instruction set.
//
// Layout shared by the portable and AVX2 kernels (docs/quantization.md derives why the zero points
// stay out of it):
//   packed A: groups of kMr rows; in a group, for each k-pair p, kMr int32s, one per row r, each
//             holding the two int16 values a[r,2p] (low half) and a[r,2p+1] (high half);
//             K padded to whole pairs and the last group to kMr rows with zeros.
//   packed B: panels of kNr = 16 columns; in a panel, for each k-pair p, 32 bytes:
//             b[2p,n0] b[2p+1,n0] b[2p,n0+1] b[2p+1,n0+1] ... b[2p+1,n0+15]
//             (8-bit, the operand's own signedness), zero padded past K and N.
// With 8-bit values widened to int16, one multiply-add of two pairs (vpmaddwd) is exact in int32,
// for every signedness combination: no saturation, unlike vpmaddubsw.
#pragma once

#include <cstdint>

#include "cpu_features.h"

namespace qmm {

constexpr int64_t kNr = 16;  // columns per B panel
constexpr int64_t kMr = 4;   // rows per micro-tile (at most)

inline int64_t k_pairs(int64_t K) { return (K + 1) / 2; }
inline int64_t n_panels(int64_t N) { return (N + kNr - 1) / kNr; }
inline int64_t packed_b_bytes(int64_t K, int64_t N) { return n_panels(N) * k_pairs(K) * 2 * kNr; }
inline int64_t packed_a_int32s(int64_t rows, int64_t K) { return (rows + kMr - 1) / kMr * kMr * k_pairs(K); }

// Packs rows [0, rows) of a row-major 8-bit matrix with row stride lda into int16 pairs.
void pack_a(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed);
// Packs panels [panel0, panel1) (columns 16*panel0 ...) of a row-major 8-bit [K, N] matrix into
// out (panel0 first), and writes colsum[n] = sum_k b[k, n] for their columns n.
void pack_b_panels(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                   int32_t* colsum);
// The same for k-pairs [p_begin, p_end) of one panel, written into out_panel (the panel's start);
// the column sums are set (first) or added to.
void pack_b_panel_rows(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel, int64_t p_begin,
                       int64_t p_end, int8_t* out_panel, int32_t* colsum, bool first);

// C[r, j] = sum over k-pairs [p0, p1) of rows [0, rows) of the packed A group at a times the
// kNr columns of the B panel at b_panel. rows <= kMr. C is row-major with row stride ldc (int32,
// wrapping: exact while the sum fits).
using QGemmKernel = void (*)(const int32_t* a, int64_t rows, const int8_t* b_panel, int64_t p0, int64_t p1,
                             bool b_signed, int32_t* c, int64_t ldc);

// y[j] = saturate(rne(max/min-clamped(f32(acc[j]) * multiplier[j])) + zp[j]) for j < count: the
// ONNX Runtime epilogue of csrc/requantize.h, vectorized.
using RequantizeRow = void (*)(const int32_t* acc, const float* multiplier, const int32_t* zp,
                               int64_t count, bool y_signed, void* y);

// y[r, n] = sum_k a[r, k] * b[k, n] for rows r < rows, float32 fused multiply-adds in order of k
// from +0 (kernels/sgemm_rows.inc): the float8 path. a is [rows, K], y [rows, N], and b comes
// in panels of 16 columns, [ceil(N / 16)][K][16], zero padded.
using SgemmRows = void (*)(const float* a, const float* b, float* y, int64_t rows, int64_t N, int64_t K);

struct NBitsWeight;
struct QuantizedA;
// MatMulNBits level 0/1 (csrc/matmul_nbits.h): Y[:, n0:n1] for all M rows of A.
using NBitsRows = void (*)(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1,
                           const float* bias, float* Y);

// MatMulNBits level 4 (csrc/matmul_nbits.h): Y[:, n0:n1] from A quantized to int8 per block.
using NBitsRowsInt8 = void (*)(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                               float* Y);

// Level 4: rearranges the int8 A [M, k_blocks * block_size] in place, once per call, into the
// order the same table's nbits_rows_int8 reads for this weight (null: the natural order).
using NBitsPrepareInt8 = void (*)(int8_t* qa, int64_t M, const NBitsWeight& w);

// Level 0/1: rearranges A [M, K] once per call into out (M * K floats) in the order the same
// table's nbits_rows reads for M rows; returns false (out unused) where it reads A as it is.
using NBitsPrepareF32 = bool (*)(const float* A, int64_t M, int64_t K, float* out);

struct QGemmKernels {
  Isa isa;
  QGemmKernel kernel;
  RequantizeRow requantize_onnxruntime;
  SgemmRows sgemm_rows;
  NBitsRows nbits_rows;
  NBitsRowsInt8 nbits_rows_int8;
  NBitsPrepareInt8 nbits_prepare_int8;
  NBitsPrepareF32 nbits_prepare_f32;
};

extern const QGemmKernels kPortableKernels;
extern const QGemmKernels kAvx2Kernels;  // defined in kernels/qgemm_avx2.cpp (compiled with -mavx2)
bool avx2_kernels_built();

// The table in use: the best supported path, or the one QUANTMATMUL_ISA / set_isa asks for.
const QGemmKernels& active_kernels();
// Forces a path (lower than or equal to the best); returns false if unsupported or not built.
bool set_isa(Isa isa);
Isa active_isa();
Isa best_isa();

}  // namespace qmm
