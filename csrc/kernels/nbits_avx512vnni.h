// nbits_avx512vnni.h: the AVX-512 VNNI MatMulNBits level-4 kernels that the avx512_vnni and amx kernel tables point to.
//
// Defined in nbits_int8_avx512vnni.cpp, in the namespace of the build that compiles them
// (avx512_vnni natively, avx512_vnni_emulated over SIMDe), so that the two builds' copies never
// meet at link time. The avx512_vnni table (qgemm_avx512vnni.cpp) takes the two kernels of its own
// build; the amx table (nbits_int8_amx.cpp) takes them for fewer than 16 rows, and the panel
// decoder for its B tiles, from the avx512_vnni build of its kind (native or emulated). Levels 0-3
// of both tables are the AVX-512 float kernels (nbits_f32_avx512.h).
#pragma once

#include <cstdint>

#include "matmul_nbits.h"

// nbits_decode_panel16: the codes of columns n0 .. n0 + cols - 1 (cols <= 16, zeros past them), k0 ..
// k1 - 1 (k0 a multiple of 64, k1 <= k_blocks * block_size), as [quad (k - k0) / 4][16 columns][4
// codes], k1 - k0 rounded up to 64: one 64-byte row per quad (the VNNI GEMM's panel, an AMX B
// tile's rows); 8-bit codes as c - 128 (int8). nbits_rows_int8_packed (nbits_packed_avx512vnni.cpp):
// the few-row kernel on a weight packed in kNBitsQuads16, which nbits_rows_int8 calls up to
// kNBitsPackedMaxRows rows (in the GEMM's float32 order from kInt8GemmMinRows rows: the same bits
// as the GEMM on the codes), and nbits_decode_panel16's work on such a weight (n0 a multiple of 16;
// k0, k1 multiples of 4).
namespace qmm {
// Below 256 rows the few-row kernel beats the GEMM on a packed weight (Zen 4, 4-bit K = N = 4096,
// 2 threads, ms GEMM / few-row: 16 rows 2.40 / 1.16, 32 rows 3.59 / 2.44, 128 rows 9.38 / 8.39 at
// blocks of 32; 7.58 / 7.28 at 128; 256 rows 19.3 / 16.8 and 12.9 / 13.0; 512 rows 34.0 / 35.0).
constexpr int64_t kNBitsPackedMaxRows = 255;
// 8-bit codes (no shift and mask to save, a column sum to add): GEMM / few-row 2.03 at 8 rows, 1.26
// at 24, 1.13 at 32, 0.90 at 64 (bs 32); 1.79, 1.03, 0.91 at 8, 24, 32 (bs 128).
constexpr int64_t kNBitsPackedMaxRows8 = 23;
}  // namespace qmm

namespace qmm::avx512_vnni {

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);
void nbits_decode_panel16(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel);
void nbits_rows_int8_packed(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                            float* Y);
void nbits_panel16_from_packed(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel);

}  // namespace qmm::avx512_vnni

// The same functions of the emulated build (identical declarations: a build defines one set).
namespace qmm::avx512_vnni_emulated {

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y);
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w);
void nbits_decode_panel16(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel);
void nbits_rows_int8_packed(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                            float* Y);
void nbits_panel16_from_packed(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel);

}  // namespace qmm::avx512_vnni_emulated
