// nbits_avx2.h: the AVX2 MatMulNBits kernels that the AVX2 kernel table (qgemm_avx2.cpp) points to.
//
// Levels 0-3 (float32 products): nbits_rows and nbits_prepare_f32, in nbits_f32_avx2.cpp.
// Level 4 (int8 A, exact integer block dot products): nbits_rows_int8 and nbits_prepare_int8, in
// nbits_int8_avx2.cpp. Both files decode the codes with nbits_decode_avx2.h and keep everything else
// in anonymous namespaces (nbits_avx2_common.h says why): these four are their only external symbols.
#pragma once

#include <cstdint>

#include "matmul_nbits.h"
#include "qgemm.h"

namespace qmm::avx2 {

void nbits_rows(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);
bool nbits_prepare_f32(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts);

}  // namespace qmm::avx2
