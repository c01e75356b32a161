// nbits_avx2.h: the AVX2 MatMulNBits kernels (kernels/nbits_avx2.cpp) that the AVX2 kernel table points to.
#pragma once

#include <cstdint>

#include "matmul_nbits.h"
#include "qgemm.h"

namespace qmm::avx2 {

void nbits_rows(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);
bool nbits_prepare_f32(const float* A, int64_t M, int64_t K, float* out);

}  // namespace qmm::avx2
