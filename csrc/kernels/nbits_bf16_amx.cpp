// nbits_bf16_amx.cpp: MatMulNBits accuracy level 3 (bfloat16 operands) on AMX-BF16 for more than 8 rows: tdpbf16ps tiles over bfloat16 pairs in k; the amxbf16 MatMulNBits entry.
//
// Level 3 multiplies A rounded to bfloat16 (the front end rounds it) by W rounded to bfloat16
// (round(float32(q - zero_point) * scale), as dequantize_nbits computes it), in float32: every
// product exact. tdpbf16ps adds them in the order "tiles of 32 k" (float8_amx.cpp; docs/
// quantization.md): per output, from +0, per chunk of 32 k, the even-k products summed from +0
// in order, the odd-k ones likewise, and their sum added; with bfloat16 inputs below 2^-126 read
// as zero and sums below 2^-126 flushed (DAZ and FTZ: docs/matmul_nbits.md's level-3 bound has a
// term for them, and holds for any order). Then + bias.
//
// Per task of 32 columns: the weights dequantized, rounded and paired into two pair panels (the
// float8 pair tables' B layout) by the avx512_vnni build's prefill code (nbits_pair_panel32), then the float8 table's
// tile kernel (pair_rows_amx); A arrives as rows of pair words (this entry's prepare_f32, once per call). Everything
// else (levels 0-2, 8 rows or fewer, level 4 on AMX-INT8) is the amx entry's: this entry differs from it only here, and
// needs AMX-BF16 besides, so it outranks it where the CPU has that (every AMX CPU so far).
// Built twice, as float8_amx.cpp (CMakeLists.txt, amxbf16).
#include "avx512_intrinsics.h"

#include <cstdint>

#include "dispatch.h"
#include "matmul_nbits.h"
#include "nbits_amx.h"
#include "nbits_avx2.h"
#include "nbits_avx2_common.h"
#include "nbits_bf16_amx.h"
#include "nbits_f32_avx512.h"

namespace qmm {
#include "nbits_pair_panels.inc"

namespace {

#if defined(QMM_EMULATED)
namespace vnni = avx512_vnni_emulated;
namespace tiles = amx_emulated;
#else
namespace vnni = avx512_vnni;
namespace tiles = amx;
#endif

void rows_bf16(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  if (!on_pairs(w, M)) return vnni::nbits_rows_f32(A, M, w, n0, n1, bias, Y);
  prefill_pairs(reinterpret_cast<const uint32_t*>(A), M, w, n0, n1, bias, Y, vnni::nbits_pair_panel32,
                QMM_KERNEL_NS::pair_rows_amx);  // A as prepare_bf16 wrote it
}

// Level 3 with more than 8 rows: row r as ceil(K / 2) pair words at r * ceil(K / 2) (out holds M * K
// floats: enough). Else the avx512_vnni build's preparation.
bool prepare_bf16(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part, int64_t parts) {
  if (!on_pairs(w, M)) return vnni::nbits_prepare_f32(A, M, w, out, part, parts);
  if (!out) return true;
  prepare_pair_words(A, M, w.K, 1, reinterpret_cast<uint32_t*>(out), part, parts);
  return true;
}

constexpr Features kNBitsFeatures = kAvx512Features | kFeatAvx512vnni | kFeatAmxTile | kFeatAmxInt8 | kFeatAmxBf16;
#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {
    .name = "amxbf16", .isa = Isa::kAmx, .needs = kAvx2Features, .emulated = true, .models = kNBitsFeatures};
#else
constexpr EntryInfo kInfo = {.name = "amxbf16", .isa = Isa::kAmx, .needs = kNBitsFeatures, .emulated = false};
#endif

}  // namespace

namespace QMM_KERNEL_NS {

const NBitsDispatch kNBitsEntry = {
    .info = kInfo,
    .rows = rows_bf16,
    .rows_prefill_columns = kPairPanelColumns,
    .rows_int8 = tiles::nbits_rows_int8,
    .prepare_int8 = tiles::nbits_prepare_int8,
    .prepare_f32 = prepare_bf16,
    .round_operands = avx2::nbits_round_operands,
    .quantize_a = avx2::nbits_quantize_a,
    .int8_tiling = tiles::kNBitsTiling,
    .int8_layout = &kNBitsQuads16,  // read by the VNNI kernels below 8 rows
    .f32_layout = &kNBitsQuads16,  // levels 0/1: nbits_packed_f32_avx512.cpp
};

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
