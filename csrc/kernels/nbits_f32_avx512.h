// nbits_f32_avx512.h: the AVX-512 MatMulNBits float kernels (levels 0-3) that the avx512_vnni and amx kernel tables point to.
//
// Defined in nbits_f32_avx512.cpp, in the namespace of the build that compiles them (QMM_KERNEL_NS:
// avx512_vnni natively, avx512_vnni_emulated over SIMDe), so that the two builds' copies never meet
// at link time; the amx table takes the avx512_vnni build's of its kind (native or emulated). They follow NBitsRows and
// NBitsPrepareF32 (matmul_nbits.h).
#pragma once

#include <cstdint>

#include "matmul_nbits.h"

namespace qmm::avx512_vnni {

void nbits_rows_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                    float* Y);
bool nbits_prepare_f32(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts);
// The pair tables' weight panels (level 3's prefill): columns [n, n + cols) (cols <= 32) as
// dequantize_nbits computes them (rounded to bfloat16 at level 3) as bfloat16 pair panels, per 16
// columns ceil(K / 2) x 16 words (k = 2j in a word's low half, 2j + 1 in its high half, k past K
// zero), the second panel at pairs + ceil(K / 2) * 16 (written only with cols > 16). Codes as
// given: not for a packed weight.
void nbits_pair_panel32(const NBitsWeight& w, int64_t n, int64_t cols, uint32_t* pairs);
// Its fast path (nbits_pairs4_avx512.cpp): the same panels for 4-bit codes in blocks of 32 or more,
// no g_idx, level 3; false, with nothing written, where a scale or float zero point is not finite.
bool nbits_pair_panel32_4bit(const NBitsWeight& w, int64_t n, int64_t cols, uint32_t* pairs);

// Columns per task that nbits_rows_f32's prefill path (more than 12 rows) wants: its tile's width.
constexpr int64_t kNBitsF32PrefillColumns = 32;

// Levels 0/1 on the "quads x16" layout (nbits_packed_f32_avx512.cpp), which nbits_rows_f32 calls:
// the few-row kernel (columns [n0, n1), n0 a multiple of 16; without a packed weight, the AVX2
// kernel on panels built per call: the same order), and the prefill's float panel of columns
// [n, n + cols) ([16 * ceil(K / 16)][32] floats, rows past K zero) from the packed weight.
void nbits_rows_packed_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* Y);
void nbits_dequantize_packed32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel);

}  // namespace qmm::avx512_vnni

// The same functions of the emulated build (identical declarations: a build defines one set).
namespace qmm::avx512_vnni_emulated {

void nbits_rows_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                    float* Y);
bool nbits_prepare_f32(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts);
// The pair tables' weight panels (level 3's prefill): columns [n, n + cols) (cols <= 32) as
// dequantize_nbits computes them (rounded to bfloat16 at level 3) as bfloat16 pair panels, per 16
// columns ceil(K / 2) x 16 words (k = 2j in a word's low half, 2j + 1 in its high half, k past K
// zero), the second panel at pairs + ceil(K / 2) * 16 (written only with cols > 16). Codes as
// given: not for a packed weight.
void nbits_pair_panel32(const NBitsWeight& w, int64_t n, int64_t cols, uint32_t* pairs);
// Its fast path (nbits_pairs4_avx512.cpp): the same panels for 4-bit codes in blocks of 32 or more,
// no g_idx, level 3; false, with nothing written, where a scale or float zero point is not finite.
bool nbits_pair_panel32_4bit(const NBitsWeight& w, int64_t n, int64_t cols, uint32_t* pairs);

// Columns per task that nbits_rows_f32's prefill path (more than 12 rows) wants: its tile's width.
constexpr int64_t kNBitsF32PrefillColumns = 32;

// Levels 0/1 on the "quads x16" layout (nbits_packed_f32_avx512.cpp), which nbits_rows_f32 calls:
// the few-row kernel (columns [n0, n1), n0 a multiple of 16; without a packed weight, the AVX2
// kernel on panels built per call: the same order), and the prefill's float panel of columns
// [n, n + cols) ([16 * ceil(K / 16)][32] floats, rows past K zero) from the packed weight.
void nbits_rows_packed_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* Y);
void nbits_dequantize_packed32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel);

}  // namespace qmm::avx512_vnni_emulated
