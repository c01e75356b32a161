// qlinear_matmul.h: QLinearMatMul in C++: packed weights, the batched problem, and the three requantization numerics.
//
// The Python front end (src/quantmatmul/qlinear.py) validates and normalizes every input into the
// batched problem described below; nothing here checks its arguments. The math is derived once in
// docs/quantization.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "buffer.h"

namespace qmm {

// A read-only view of a parameter broadcast over the output [batch, M, N], with element strides that
// may be 0 (a per-tensor scale has all three strides 0, a per-column one only stride_n != 0, ...).
template <class T>
struct View3 {
  const T* data;
  int64_t stride_batch, stride_m, stride_n;
  T operator()(int64_t b, int64_t m, int64_t n) const { return data[b * stride_batch + m * stride_m + n * stride_n]; }
};

struct QGemmLayout;
struct QGemmDispatch;

// One or more 8-bit [K, N] matrices b, packed once in the layout of the int8 GEMM entry in use
// (csrc/qgemm.h) with their column sums. QLinearMatMul keeps one for a constant weight;
// qlinear_matmul packs per call. The layout is recorded: a product run under an entry that reads
// another layout raises std::runtime_error instead of computing with it.
struct PackedB {
  int64_t count = 0, K = 0, N = 0;
  bool is_signed = false;
  const QGemmLayout* layout = nullptr;
  const QGemmDispatch* entry = nullptr;  // the entry in use when packed (calls may run on it: call_entry)
  Buffer<int8_t> data;           // count * layout->packed_b_bytes(K, N), 64-byte aligned, every byte written
  std::vector<int32_t> colsum;           // count * N: sum_k b[k, n]
  const int8_t* matrix(int64_t i) const;
  size_t bytes() const;
};

// Packs b, contiguous [count, K, N], 8-bit of the given signedness, for the int8 GEMM entry in use;
// for_receptive_fields: for qgemm_taps_kernels() instead (a convolution's weight, dispatch.h).
PackedB pack_b_matrices(const void* b, bool is_signed, int64_t count, int64_t K, int64_t N,
                        bool for_receptive_fields = false);

// batch independent products out[i] = (a[a_index[i]] - a_zp) x (b[b_index[i]] - b_zp).
// a is contiguous [Ba, M, K] 8-bit (signedness given). b is either packed (b_packed, a constant
// weight) or contiguous [Bb, K, N] 8-bit (b_raw, b_signed), which each task then packs for its
// own columns only, in cache. The index arrays implement numpy's batch broadcasting.
// a_zero_point is [Ba, M], b_zero_point is [Bb, N] (or one matrix's, shared: the strides below).
struct QGemmProblem {
  int64_t batch, M, N, K;
  const void* a;
  bool a_signed;
  const int64_t* a_index;
  const int32_t* a_zero_point;
  const PackedB* b_packed;
  const void* b_raw;
  bool b_signed;
  const int64_t* b_index;
  const int32_t* b_zero_point;
  // Optional, per column of each b matrix ([b count, N], matrix ib's at ib * N): added to every int32
  // sum of that column before the epilogue, wrapping as the sums do (the exact int64 products refuse
  // it). A convolution's bias in ONNX Runtime's numerics (onnx/_qconv.py); null for none.
  const int32_t* column_bias = nullptr;
  // Optional: a is x, read in place through a table of receptive fields instead of as a matrix (a
  // convolution without an im2col, csrc/conv.cpp): row m's k-quads for tap t are the K / (4 a_taps)
  // int32s at a + a_offsets[m * a_taps + t] (bytes), or at a_pad where that offset is negative. Only
  // on an entry and problem for which taps_usable holds (int32 numerics).
  const int32_t* a_offsets = nullptr;
  int64_t a_taps = 0;
  const uint8_t* a_pad = nullptr;
  // Elements from one matrix's zero points to the next's: M and N where negative (each matrix its own
  // row of them), 0 where every matrix shares one ([M] and [N]: a batch with per-tensor zero points).
  int64_t a_zero_point_ld = -1, b_zero_point_ld = -1;
};

// Whether entry q reads such a table for this problem: its kernel_taps on the quads layout, a uint8
// (stored as given), no row sums wanted (every column's b zero point plus the layout's offset 0), one
// product, K whole quads per tap.
bool taps_usable(const QGemmDispatch& q, bool a_signed, bool need_rowsums, int64_t batch, int64_t K, int64_t taps);
// The same for problem p (a_taps set) on the entry a call would run it on now.
bool taps_usable(const QGemmProblem& p);

// A com.microsoft QLinearAdd of the product's output and a row of N codes (a bias) or a matrix of them
// laid out as the output (a residual: ld = N), as ONNX
// Runtime computes it (onnx_ops.h, qlinear_add_codes): with p the product's 8-bit output and c the
// row's code of its column, out = sat(cvt(fma32(x, rx, fma32(y, ry, k)))) with (x, y) = (p, c) where
// product_first, else (c, p). Applied to each block of the output as the block is written (numerics
// "onnxruntime" only): the session's QLinearMatMul -> QLinearAdd(bias) and QLinearConv -> QLinearAdd
// pairs without a second pass.
struct QLinearAddStage {
  const void* codes;  // the output's type: output row m's codes at codes + m * ld (ld 0: one row [N] for all)
  bool product_first;
  float rx, ry, k;
  int64_t ld = 0;
  const QLinearAddStage* next = nullptr;  // a second add on this one's output (a residual after a bias), or null
};

// The 8-bit integer output, contiguous [batch, M, N], and its (broadcast) zero point; add: a
// QLinearAdd after it, or null (qlinear_matmul_onnxruntime only).
struct QOutput {
  void* data;
  bool is_signed;
  View3<int32_t> zero_point;
  const QLinearAddStage* add = nullptr;
};

// The driver's blocking (csrc/qlinear_matmul.cpp), by default the layout's (QGemmLayout's
// task_rows, task_panel_bytes and k_block, csrc/qgemm.h) and 16 tasks per thread for a constant b.
// A nonzero field here replaces that default for every later call: for benchmarks that compare
// blockings in one process (benchmarks/blocking.py) and for the tests, which check that no blocking
// changes a bit. task_rows is rounded up to a whole number of the layout's row groups (mr), k_block
// to whole k-groups (kc). Set it only while no product runs.
struct QGemmBlocking {
  int64_t task_rows = 0, task_panel_bytes = 0, k_block = 0, tasks_per_thread = 0;
};
void set_qgemm_blocking(const QGemmBlocking& blocking);
// The blocking a call with this layout uses now: every field filled in.
QGemmBlocking qgemm_blocking(const QGemmLayout& layout);

// numerics="onnxruntime": int32 (wrapping) accumulator -> float32, one float32 multiply by
// multiplier = f32(f32(a_scale * b_scale) / y_scale), clamp, round half to even, + zero point.
void qlinear_matmul_onnxruntime(const QGemmProblem& p, View3<float> multiplier, QOutput out);
// ONNX MatMulInteger: y[b, m, n] = sum_k (a - a_zp)(b - b_zp) in wrapping int32 (exact while it
// fits), y contiguous [batch, M, N]; K >= 1.
void matmul_integer(const QGemmProblem& p, int32_t* y);
// Those sums as a quantize_dynamic model's MatMulInteger -> Cast(to=FLOAT) -> Mul(scale) (-> Add(bias))
// nodes give them (onnx/_dynamic.py), each step rounded on its own: y[b, m, n] = f32(float(sum) *
// scale[n]) (scale[0] for every n where scale_per_column is false), then + bias[n] where bias is not
// null; y contiguous float32 [batch, M, N]; K >= 1.
void matmul_integer_scaled(const QGemmProblem& p, const float* scale, bool scale_per_column, const float* bias,
                           float* y);
// The same with the columns split among outputs (products of one a side by side in b: quantize_dynamic's
// query, key and value): columns [begin, end) go to y contiguous float32 [batch, M, end - begin]; the
// spans cover [0, N) without overlap.
struct ColumnSpan {
  int64_t begin, end;
  float* y;
};
void matmul_integer_scaled(const QGemmProblem& p, const float* scale, bool scale_per_column, const float* bias,
                           const std::vector<ColumnSpan>& spans);

// numerics="onnx-reference": int32 (wrapping) accumulator; rint(f64(acc) * multiplier + zp) in float64,
// where multiplier is a_scale * b_scale / y_scale evaluated in the scales' own dtype; then clip.
void qlinear_matmul_onnx_reference(const QGemmProblem& p, View3<double> multiplier, QOutput out);

// numerics="exact": 64-bit accumulator (never wraps) and round half to even of the exact rational
// acc * a_scale * b_scale / y_scale, then + zero point and saturate.
void qlinear_matmul_exact(const QGemmProblem& p, View3<float> a_scale, View3<float> b_scale, View3<float> y_scale,
                          QOutput out);

// Exact integer matmul with a 128-bit accumulator, for the "exact" float8 path: a and b hold
// integers below 2^35 in magnitude (float8 values scaled to integers), so each product fits 70 bits
// and any realistic K fits 128. The sum is returned split as out_hi * 2^64 + out_lo.
void matmul_i64_exact128(int64_t batch, int64_t M, int64_t N, int64_t K, const int64_t* a, const int64_t* a_index,
                         const int64_t* b, const int64_t* b_index, int64_t* out_hi, uint64_t* out_lo);

}  // namespace qmm
