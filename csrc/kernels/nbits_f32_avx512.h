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
// Prefill's weight panel: columns [n, n + cols) (cols <= 32) as dequantize_nbits computes them
// (rounded to float16 / bfloat16 at levels 2 / 3) into panel, [16 * ceil(K / 16)][32] floats,
// 64-byte aligned, k in order, rows past K zero; with cols <= 16 only the first 16 of each row.
void nbits_f32_panel32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel);

// Columns per task that nbits_rows_f32's prefill path (more than 12 rows) wants: its tile's width.
constexpr int64_t kNBitsF32PrefillColumns = 32;

// Levels 0/1 on the "quads x16" layout (nbits_packed_f32_avx512.cpp), which nbits_rows_f32 and
// nbits_f32_panel32 call: the few-row kernel (columns [n0, n1), n0 a multiple of 16; without a
// packed weight, the AVX2 kernel on panels built per call: the same order), and the prefill's
// panel, as nbits_f32_panel32 writes it, from the packed weight.
void nbits_rows_packed_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* Y);
void nbits_dequantize_packed32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel);

}  // namespace qmm::avx512_vnni

// The same functions of the emulated build (identical declarations: a build defines one set).
namespace qmm::avx512_vnni_emulated {

void nbits_rows_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                    float* Y);
bool nbits_prepare_f32(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts);
// Prefill's weight panel: columns [n, n + cols) (cols <= 32) as dequantize_nbits computes them
// (rounded to float16 / bfloat16 at levels 2 / 3) into panel, [16 * ceil(K / 16)][32] floats,
// 64-byte aligned, k in order, rows past K zero; with cols <= 16 only the first 16 of each row.
void nbits_f32_panel32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel);

// Columns per task that nbits_rows_f32's prefill path (more than 12 rows) wants: its tile's width.
constexpr int64_t kNBitsF32PrefillColumns = 32;

// Levels 0/1 on the "quads x16" layout (nbits_packed_f32_avx512.cpp), which nbits_rows_f32 and
// nbits_f32_panel32 call: the few-row kernel (columns [n0, n1), n0 a multiple of 16; without a
// packed weight, the AVX2 kernel on panels built per call: the same order), and the prefill's
// panel, as nbits_f32_panel32 writes it, from the packed weight.
void nbits_rows_packed_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* Y);
void nbits_dequantize_packed32(const NBitsWeight& w, int64_t n, int64_t cols, float* panel);

}  // namespace qmm::avx512_vnni_emulated
