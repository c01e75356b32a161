// nbits_bf16_avx512.cpp: MatMulNBits accuracy level 3 (bfloat16 operands) on AVX512-BF16 for more than 8 rows: 12 x 32 vdpbf16ps tiles over bfloat16 pairs in k.
//
// Level 3 multiplies A rounded to bfloat16 (the front end rounds it) by W rounded to bfloat16
// (round(float32(q - zero_point) * scale), as dequantize_nbits computes it), in float32. Every
// such product is exact in float32, so vdpbf16ps, which adds two of them per lane and step, loses
// nothing but the order and the denormals: per output, from +0, for each pair j of k:
//   y = f32(y + a[2j+1] * w[2j+1]);  y = f32(y + a[2j] * w[2j])
// with bfloat16 inputs below 2^-126 read as zero and sums below 2^-126 flushed to zero (DAZ and
// FTZ: docs/matmul_nbits.md's level-3 bound has a term for them). Twice the products per
// instruction of the AVX-512F FMA tile the avx512_vnni entry runs at level 3.
//
// Per task of 32 columns: the weights dequantized, rounded and paired into two pair panels
// [ceil(K/2)][16] words by the avx512_vnni build's prefill code (nbits_pair_panel32), then float8_avx512.inc's blocking
// with pair_tile_avx512bf16.inc's tile; A arrives as pair words in groups of 12 rows (this entry's prepare_f32, once
// per call). Other levels, 8 rows or fewer, and level 4 are the avx512_vnni build's kernels: the entry differs from
// that build's only here. Built twice, as float8_avx512bf16.cpp (CMakeLists.txt, avx512bf16).
#include "avx512_intrinsics.h"
#if defined(QMM_EMULATED)
#include "bf16_emulation.h"  // after SIMDe: it uses its AVX-512 types
#endif

#include <cstdint>

#include "dispatch.h"
#include "matmul_nbits.h"
#include "nbits_avx2.h"
#include "nbits_avx2_common.h"
#include "nbits_avx512vnni.h"
#include "nbits_bf16_avx512.h"
#include "nbits_f32_avx512.h"

namespace qmm {
#include "float8_avx512.inc"
#include "nbits_pair_panels.inc"
#include "pair_tile_avx512bf16.inc"

namespace {

#if defined(QMM_EMULATED)
namespace vnni = avx512_vnni_emulated;
#else
namespace vnni = avx512_vnni;
#endif

void rows_bf16(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  if (!on_pairs(w, M)) return vnni::nbits_rows_f32(A, M, w, n0, n1, bias, Y);
  auto pair_rows = [](const uint32_t* a, const uint32_t* b, float* y, int64_t ldy, int64_t rows, int64_t cols,
                      int64_t K) { blocked_rows(a, b, y, ldy, rows, cols, (K + 1) / 2, kPairTiles); };
  prefill_pairs(reinterpret_cast<const uint32_t*>(A), M, w, n0, n1, bias, Y, vnni::nbits_pair_panel32,
                pair_rows);  // A as prepare_bf16 wrote it
}

// Level 3 with more than 8 rows: each group of 12 rows (the last M % 12) as pair words, [ceil(K/2)][rows],
// at the group's first row times ceil(K / 2) words (out holds M * K floats: enough). Else the
// avx512_vnni build's preparation.
bool prepare_bf16(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts) {
  if (!on_pairs(w, M)) return vnni::nbits_prepare_f32(A, M, w, out, part, parts);
  if (!out) return true;
  prepare_pair_words(A, M, w.K, kAGroup, reinterpret_cast<uint32_t*>(out), part, parts);
  return true;
}

constexpr Features kNBitsFeatures = kAvx512Features | kFeatAvx512vnni | kFeatAvx512bf16;
#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {
    .name = "avx512bf16", .isa = Isa::kAvx512Vnni, .needs = kAvx2Features, .emulated = true, .models = kNBitsFeatures};
#else
constexpr EntryInfo kInfo = {.name = "avx512bf16", .isa = Isa::kAvx512Vnni, .needs = kNBitsFeatures, .emulated = false};
#endif

}  // namespace

namespace QMM_KERNEL_NS {

const NBitsDispatch kNBitsEntry = {
    .info = kInfo,
    .rows = rows_bf16,
    .rows_prefill_columns = kPairPanelColumns,
    .rows_int8 = vnni::nbits_rows_int8,
    .prepare_int8 = vnni::nbits_prepare_int8,
    .prepare_f32 = prepare_bf16,
    .round_operands = avx2::nbits_round_operands,
    .quantize_a = avx2::nbits_quantize_a,
    .int8_layout = &kNBitsQuads16,  // read by the VNNI kernels below 8 rows
    .f32_layout = &kNBitsQuads16,  // levels 0/1: nbits_packed_f32_avx512.cpp
};

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
