// onnx_ops.h: operators of the ONNX session in C++ (Erf as onnx.reference computes it, DynamicQuantizeLinear as ONNX Runtime does, byte-pair table lookups) and its heap settings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qmm {

// y[i] = float32(erf(double(x[i]))) with the C library's erf: onnx.reference's Erf (math.erf on
// each element, the double result rounded to float32), over the thread pool. A float32 x goes
// through `path`: "libm" (std::erf on each element), "avx512" (kernels/erf_avx512.cpp: a
// polynomial, std::erf where rounding could tell them apart; the same bits), "avx512-emulated"
// (the same code over SIMDe, for the tests), or "" (the one erf_path() names); false, computing
// nothing, for a path that is not there (erf_paths()).
bool erf_f32(const float* x, int64_t count, float* y, const char* path = "");
void erf_f32(const double* x, int64_t count, float* y);
// The path "" takes now: "avx512" where it is built, the CPU has AVX-512 (F, BW, DQ, VL) and the
// kernel level (set_isa, hidden features) is avx512_vnni or higher, else "libm".
const char* erf_path();
// The paths this build and CPU can run.
std::vector<std::string> erf_paths();
// One path's loop on the calling thread (y[i] for i in [0, count), the bits of erf_f32), or null for a
// path that is not there.
using ErfRange = void (*)(const float* x, int64_t count, float* y);
ErfRange erf_range(const char* path = "");

// ONNX DynamicQuantizeLinear's scale and zero point (uint8) from x's range, as ONNX Runtime's CPU
// kernel computes them in float32 (docs/onnx.md): lo = min(min(x), 0), hi = max(max(x), 0),
// scale = hi == lo ? 1 : (hi - lo) / 255, zero point = round_half_even(max(0, min(255, 0 - lo / scale)))
// (a NaN quotient gives 255, as std::min puts it). NaN elements are left out of min(x) and max(x).
struct DynamicQuantization {
  float scale;
  uint8_t zero_point;
};
DynamicQuantization dynamic_quantization(const float* x, int64_t count);
// DynamicQuantizeLinear: those parameters, and y = QuantizeLinear(x, scale, zero point) (uint8,
// quantize_linear.h's arithmetic: ONNX Runtime's, whatever the scale, 0 and infinity included).
DynamicQuantization dynamic_quantize_linear(const float* x, int64_t count, uint8_t* y);

// QLinearAdd and QLinearMul as ONNX Runtime's x86-64 kernels compute them (onnx/_qlinear_ops.py), on
// int8 (is_signed) or uint8 x and y, `count` outputs, over the thread pool:
//   add: out[i] = sat(cvt(fma32(x[i], rx, fma32(y[i], ry, k))))
//   mul: out[i] = sat(cvt(f32(f32(f32((x[i] - zx) * (y[i] - zy)) * r) + zc)))
// (cvt: cvtps2dq, round half to even, NaN and |v| >= 2^31 INT32_MIN; sat: the 8-bit type's range).
// x and y hold x_count and y_count elements: count, or for one of them a divisor of count, which
// then repeats (x[i % x_count]: a bias or a scalar broadcast over the output's leading dimensions).
// The loops of qlinear_binary_loops.inc, built for the baseline and for AVX2 (the same bytes).
void qlinear_add_codes(const void* x, int64_t x_count, const void* y, int64_t y_count, int64_t count, bool is_signed,
                       float rx, float ry, float k, void* out);
void qlinear_mul_codes(const void* x, int64_t x_count, const void* y, int64_t y_count, int64_t count, bool is_signed,
                       int32_t zx, int32_t zy, float r, float zc, void* out);
// qlinear_add_codes' arithmetic on count elements of x and y into out (out may be x or y), on the calling
// thread (the QLinearMatMul driver's QLinearAddStage, a block's row at a time).
void qlinear_add_span(const void* x, const void* y, int64_t count, bool is_signed, float rx, float ry, float k,
                      void* out);
// QLinearSoftmax's rows as ONNX Runtime computes them (onnx/_qlinear_ops.py): x [rows, D] int8 (is_signed)
// or uint8 codes, contiguous; per row e_j = table[255 - (max_k x_k - x_j)], sum = e_0 + e_1 + ... in
// float32 one after another, out_j = sat(nearbyint(double(e_j) * yd / double(sum)) + y_zp) in double
// (NaN: 0). Over the thread pool.
void qlinear_softmax_rows(const void* x, bool is_signed, int64_t rows, int64_t D, const float* table, double yd,
                          int32_t y_zp, void* out);
// QLinearGlobalAveragePool as MLAS computes it (onnx/_qlinear_pool.py): x N images of S pixels and C
// channels, int8 (is_signed) or uint8, contiguous [N, S, C] (channels_last) or [N, C, S]; y [N, C] =
// sat(rne(clamp(f32(acc) * scale, [qmin - y_zp, qmax - y_zp])) + y_zp) with acc = sum(x) - x_zp * S
// wrapped to int32 (NaN: the lower bound). One thread (a network's last pool is a few thousand values).
void qlinear_global_average_pool_codes(const void* x, bool is_signed, int64_t N, int64_t S, int64_t C,
                                       bool channels_last, int32_t x_zp, float scale, int32_t y_zp, void* y);
// The build qlinear_add_codes / qlinear_mul_codes run now: "avx2" (where built, the CPU has it and
// the kernel level is avx2 or higher) or "portable".
const char* qlinear_binary_path();

// LayerNormalization (stash_type 1, float32) as onnx.reference computes it in numpy, bit for bit: x
// [rows, cols] contiguous, each row normalized by its mean and variance (numpy's pairwise float32 sums,
// each over cols in float32), 1 / sqrt(variance + epsilon), times scale [cols], plus bias [cols] (or
// null); y [rows, cols], mean and inv_std_dev [rows]. With a residual [rows, cols] (or null), the rows of
// x + residual (float32 sums) instead of x; y may be x. Over the thread pool (csrc/layer_norm.cpp).
void layer_norm_rows(const float* x, int64_t rows, int64_t cols, const float* scale, const float* bias, float epsilon,
                     float* y, float* mean, float* inv_std_dev, const float* residual = nullptr);

// np.sum of n contiguous float32 values, as numpy reduces a contiguous row: the identity +0.0 plus the
// row's pairwise sum (numpy/_core/src/umath/loops_utils.h.src, csrc/layer_norm.cpp).
float numpy_sum(const float* a, int64_t n);

// onnx.reference's float32 element-wise operators, chained on one value (csrc/float_ops.cpp): each
// step computes the chain's value from it and operands (any strides, broadcast as numpy broadcasts),
// rounding each operation to float32 as numpy's ufuncs do; kErf as erf_f32 (its path).
enum class ChainOp : int32_t { kAdd, kSub, kMul, kDiv, kErf, kSqrt, kNeg };
constexpr int32_t kChainValue = -1;  // a step's source: the chain's value (from the second step on)
constexpr int kMaxChainRank = 16;
struct ChainStep {
  ChainOp op;
  int32_t a, b;  // operand indices or kChainValue (b unused for kErf, kSqrt, kNeg)
};
struct ChainOperand {
  const float* data;
  std::vector<int64_t> shape, strides;  // strides in elements
};
// The chain's output shape: numpy's broadcast of the operands' (invalid_argument where they do not
// broadcast or pass kMaxChainRank dimensions).
std::vector<int64_t> chain_shape(const std::vector<ChainOperand>& operands);
// The steps' value into y (C-contiguous, chain_shape's shape), over the thread pool.
void float_chain(const std::vector<ChainOperand>& operands, const std::vector<ChainStep>& steps, const char* erf_path,
                 float* y);
// onnx.reference's Softmax over the last axis (tmp = x - max(x), y = exp(tmp), y /= sum(y)) around numpy's
// exp, on x [rows, cols] contiguous: y = x - the row's maximum (the row's first NaN where it holds one),
// then (after np.exp in place) each row divided by numpy_sum of it.
void softmax_shift_rows(const float* x, int64_t rows, int64_t cols, float* y);
void softmax_normalize_rows(float* y, int64_t rows, int64_t cols);

// out[i] = table[codes[i]] for i in [0, count): an element-wise group of the session on one 8-bit
// tensor, run once on its 256 codes (onnx/_tables.py); table 256 elements of element_bytes each
// (1, 2, 4 or 8; false, computing nothing, otherwise). Over the thread pool. Tables of bytes go
// through `path`: "scalar" (a load of the code and one of the entry each), "avx512vbmi"
// (kernels/lookup_avx512vbmi.cpp: 64 codes at a time), "avx512vbmi-emulated" (that code over
// SIMDe, for the tests), or "" (the one lookup_path() names); false for a path that is not there.
bool lookup_codes(const uint8_t* codes, int64_t count, const void* table, int element_bytes, void* out,
                  const char* path = "");
// The path "" takes now: "avx512vbmi" where it is built, the CPU has AVX-512 VBMI (with F, BW, DQ,
// VL) and the kernel level (set_isa, hidden features) is avx512_vnni or higher, else "scalar".
const char* lookup_path();
// The paths this build and CPU can run.
std::vector<std::string> lookup_paths();

// The C library's heap keeps up to top_pad bytes of freed memory at its top for reuse instead of
// handing them back to the system, and serves blocks below mmap_threshold bytes from the heap
// (glibc's M_TOP_PAD, M_MMAP_THRESHOLD): onnx.reference's numpy temporaries, freed and allocated
// again on every node, otherwise fault their pages in anew (half of a MiniLM batch's time). False
// where the C library has no such settings or a value is out of range (0 .. 1 GiB).
bool keep_heap(int64_t top_pad, int64_t mmap_threshold);

}  // namespace qmm
