// nbits_amx.h: the AMX MatMulNBits level-4 kernels (nbits_int8_amx.cpp) and their task shape, for the amx kernel table (qgemm_amx.cpp).
//
// Included only by the amx builds' files: QMM_KERNEL_NS is amx natively, amx_emulated in the
// emulated build (tiles over amx_emulation.h).
#pragma once

#include <cstdint>

#include "matmul_nbits.h"

namespace qmm::QMM_KERNEL_NS {

// 16 rows or more: A in groups of 32 rows (two A tiles of 16 rows), tasks of 32 columns (two B
// tiles of 16 columns) x ranges of whole groups (matmul_nbits.h). Fewer rows: the avx512_vnni
// build's kernels, over all rows in tasks of 16 columns, as in the avx512_vnni table.
constexpr NBitsInt8Tiling kNBitsTiling = {.min_rows = 16, .columns = 32, .row_group = 32};

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);

}  // namespace qmm::QMM_KERNEL_NS
