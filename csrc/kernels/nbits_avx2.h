// nbits_avx2.h: the AVX2 MatMulNBits kernels that the AVX2 kernel table (qgemm_avx2.cpp) points to.
//
// Levels 0-3 (float32 products): nbits_rows, in nbits_f32_avx2.cpp.
// Level 4 (int8 A, exact integer block dot products): nbits_rows_int8 and nbits_prepare_int8, in
// nbits_int8_avx2.cpp; on a weight packed once (the entry's int8 layout), nbits_packed_avx2.cpp. Both files decode the
// codes with nbits_decode_avx2.h and keep everything else in anonymous namespaces (nbits_avx2_common.h says why): the
// declarations below are their only external symbols.
#pragma once

#include <cstdint>

#include "matmul_nbits.h"
#include "qgemm.h"

namespace qmm::avx2 {

void nbits_rows(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
// Levels 2/3: A's rounding (NBitsRoundOperands), 8 values at a time with F16C or integer arithmetic;
// the AVX-512 entries use it too (their CPUs have AVX2 and F16C).
void nbits_round_operands(float* x, int64_t count, NBitsOperands operands);
void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);
// Level 4: A's quantization (NBitsQuantizeA), 8 values at a time, quantize_a_int8_rows' results; the
// AVX-512 entries use it too.
void nbits_quantize_a(const float* A, int64_t m0, int64_t m1, int64_t K, int64_t block_size, int8_t* qa, float* scale,
                      float* block_sum);

// Level 4 on a weight packed in kNBitsQuads16 (matmul_nbits.h; nbits_packed_avx2.cpp), which
// nbits_rows_int8 calls: the few-row kernel (A as quantize_a_int8 writes it, columns [n0, n1) with n0
// a multiple of 16), and the GEMM's panel of columns n0 .. n0+15 as quads of bytes,
// [k/4][16 columns][4 codes].
void nbits_rows_int8_packed(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                            float* Y);
void nbits_panel_from_packed(const NBitsWeight& w, int64_t n0, uint8_t* panel);
// Levels 0/1 (float32 operands) on a weight packed in kNBitsQuads16, few rows (nbits_packed_avx2.cpp):
// columns [n0, n1), n0 a multiple of 16.
void nbits_rows_packed(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                       float* Y);
// Columns [n0, n0 + 16) of w's codes as they are as a panel of kNBitsQuads16 (3- and 4-bit codes
// in 4-bit storage, the others a byte per code, 8-bit ones not offset) with its scales and float
// zero points ([k_blocks][16] each); columns: room for 16 rows of `stride` (k_blocks * block_size +
// 32) bytes (nbits_packed_avx2.cpp; the AVX-512 few-row kernel builds its panels with it too).
void nbits_rows_panel(const NBitsWeight& w, int64_t n0, uint8_t* columns, int64_t stride, uint8_t* codes, float* scales,
                      float* float_zero_points);
// Levels 0/1 prefill on a packed weight: columns n0 .. n0+15 (n0 a multiple of 16) dequantized into
// panel [K8][16] exactly as dequantize_nbits does (float32(q - zero_point) * scale), rows past K zero.
void nbits_dequantize_packed(const NBitsWeight& w, int64_t n0, float* panel);

}  // namespace qmm::avx2
