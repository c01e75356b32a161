// nbits_amx.h: the AMX MatMulNBits level-4 kernels (nbits_int8_amx.cpp) and their task shape, for the amx and amxbf16 kernel tables.
//
// Defined in nbits_int8_amx.cpp, in the namespace of the build that compiles it (amx natively,
// amx_emulated over amx_emulation.h's tiles); the amxbf16 MatMulNBits entry (nbits_bf16_amx.cpp)
// takes them from the amx build of its kind.
#pragma once

#include <cstdint>

#include "matmul_nbits.h"

namespace qmm::amx {

// 16 rows or more: A in groups of 32 rows (two A tiles of 16 rows), tasks of 32 columns (two B
// tiles of 16 columns) x ranges of whole groups (matmul_nbits.h). Fewer rows: the avx512_vnni
// build's kernels, over all rows in tasks of 16 columns, as in the avx512_vnni table.
constexpr NBitsInt8Tiling kNBitsTiling = {.min_rows = 16, .columns = 32, .row_group = 32};

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);

}  // namespace qmm::amx

// The same of the emulated build (identical declarations: a build defines one set).
namespace qmm::amx_emulated {

constexpr NBitsInt8Tiling kNBitsTiling = amx::kNBitsTiling;

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);

}  // namespace qmm::amx_emulated
