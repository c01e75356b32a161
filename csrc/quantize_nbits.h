// quantize_nbits.h: block-wise 2..8-bit weight quantization for MatMulNBits ("rtn", "mse", "hqq"), the loops behind quantize_nbits.py.
//
// The formulas, their order of float operations and the layout of the result are those of
// src/quantmatmul/reference/quantize_nbits.py (numpy), which the tests hold this code to byte for
// byte; docs/quantizer.md describes each method.
#pragma once

#include <cstdint>

namespace qmm {

enum class QuantizeMethod : int { kRtn = 0, kMse = 1, kHqq = 2 };

// Element types of W and of the stored scales (and float zero points): float16 and bfloat16 are
// raw 16-bit patterns.
enum class QuantizeType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// The "mse" search's float32 factors (quantize_nbits.py's _MSE_* grids).
struct MseGrid {
  const float* shrink;  // asymmetric: both ends of the range scaled by each (p = 1 excluded)
  int64_t shrink_count;
  const float* local;  // then each end moved alone by each step (0 excluded) ...
  int64_t local_count;
  int64_t local_rounds;  // ... this many times
  const float* sym_shrink;  // symmetric: the scale's factors, each in both orientations
  int64_t sym_shrink_count;
  int64_t refits;  // least-squares rescalings of the best codes
};

struct QuantizeNBitsProblem {
  const void* w;  // W [K, N], any strides (in elements), finite or not (checked here)
  QuantizeType w_type;
  int64_t K, N, stride_k, stride_n;
  int bits;  // 2..8
  int64_t block_size;  // a power of two >= 16
  bool symmetric;  // not with kHqq
  QuantizeMethod method;
  QuantizeType scale_type;  // kFloat32, kFloat16 or kBFloat16
  MseGrid mse;
};

struct QuantizeNBitsOutput {
  uint8_t* B;  // [N, k_blocks, block_size * bits / 8], each row one LSB-first bitstream
  void* scales;  // [N, k_blocks] of scale_type
  // kHqq: float [N, k_blocks] of scale_type; else uint8 [N, ceil(k_blocks * bits / 8)] packed like
  // B along the block axis; null when symmetric.
  void* zero_points;
};

// kNotFinite: some element of W is not finite as float32; kRangeOverflow (asymmetric only): some
// block's max(x, 0) - min(x, 0) overflows float32. The outputs are then incomplete; the caller
// finds and names the culprit.
enum class QuantizeStatus : int { kOk = 0, kNotFinite = 1, kRangeOverflow = 2 };

// Quantizes W into out (the caller allocates it), threaded over blocks; the block loops run in
// their AVX2 build where the active ISA level (set_isa) is avx2 or higher and the CPU has AVX2,
// else in their baseline build. Both give the same bytes.
QuantizeStatus quantize_nbits(const QuantizeNBitsProblem& p, const QuantizeNBitsOutput& out);

// The build of the block loops quantize_nbits runs now: "avx2" or "portable".
const char* quantize_nbits_path();

// float32 to float16 / bfloat16 bits, round to nearest even (numpy's and ml_dtypes' astype).
uint16_t float_to_half_bits(float x);
uint16_t float_to_bfloat16_bits(float x);

}  // namespace qmm
