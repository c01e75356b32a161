// nbits_avx512vnni.h: the AVX-512 VNNI MatMulNBits level-4 kernels that the avx512_vnni kernel table (qgemm_avx512vnni.cpp) points to.
//
// Defined in nbits_int8_avx512vnni.cpp, in the namespace of the build that compiles them
// (QMM_KERNEL_NS: avx512_vnni natively, avx512_vnni_emulated over SIMDe), so that the two builds'
// copies never meet at link time. Levels 0-3 of that table are the AVX2 float kernels (nbits_avx2.h).
#pragma once

#include <cstdint>

#include "matmul_nbits.h"

namespace qmm::QMM_KERNEL_NS {

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);

}  // namespace qmm::QMM_KERNEL_NS
