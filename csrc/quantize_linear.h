// quantize_linear.h: ONNX QuantizeLinear / DequantizeLinear for float32 and 8- or 16-bit integers, per tensor or per axis: the loops behind quantize_linear.py's common case.
//
// The arithmetic is quantize_linear.py's (onnxruntime's, bit for bit): quantize
//   y = clamp(rne(x / scale) + zero_point, lo, hi), NaN -> lo    (float32 division and rounding)
// dequantize
//   y = float32(x - zero_point) * scale                          (one float32 product)
// with scale and zero point those of channel c = (i / inner) % channels for element i of the
// contiguous x (channels 1: per tensor). Elements go in tasks over the thread pool; the loops are
// built for the baseline and again for AVX2 (kernels/quantize_linear_avx2.cpp), picked at run time.
#pragma once

#include <cstdint>

namespace qmm {

enum class IntType : int { kInt8 = 0, kUInt8 = 1, kInt16 = 2, kUInt16 = 3 };

struct LinearShape {
  int64_t count;  // elements of x
  int64_t channels;  // scales (1: per tensor)
  int64_t inner;  // consecutive elements sharing one scale (count / channels / outer)
};

void quantize_linear_f32(const float* x, const LinearShape& shape, const float* scale, const int32_t* zero_point,
                         IntType type, void* y);
void dequantize_linear_f32(const void* x, IntType type, const LinearShape& shape, const float* scale,
                           const int32_t* zero_point, float* y);
// "avx2" or "portable": the loops the calls above run now (set_isa, hidden features).
const char* quantize_linear_path();

}  // namespace qmm
