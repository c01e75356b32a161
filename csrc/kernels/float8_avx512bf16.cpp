// float8_avx512bf16.cpp: the float8 path's GEMM on AVX512-BF16: 12 x 32 register tiles of vdpbf16ps over bfloat16 pairs in k.
//
// Contract (PairRows in csrc/qgemm.h): a and b as bfloat16 pairs, word j of a row of a or a column
// of b holding k = 2j (low half) and k = 2j + 1 (high half); the driver uses this table only when
// every value is pair-exact (its bfloat16 half is the value, 2^-48 <= |x| < 2^48 or 0), so every
// product is exact in float32 and no denormal arises (docs/quantization.md, "bfloat16 pairs").
// Order ("odd first"): y[m, n] starts at +0 and, for j = 0, 1, ..., ceil(K / 2) - 1,
//   y = f32(y + a[m, 2j+1] * b[2j+1, n]);  y = f32(y + a[m, 2j] * b[2j, n])
// which is vdpbf16ps's per lane (two float32 FMAs in sequence, the high halves first). K odd: the
// last word's high halves are +0 and +0 * +0 added to a sum that is never -0 changes nothing.
//
// Tile: 12 rows x 32 columns, 24 zmm accumulators (kernels/float8_avx512.inc's blocking, in steps
// of one k pair):
//   per pair j:  w0 = panel p[j][0..15], w1 = panel p+1[j][0..15]   (16 words: 32 bfloat16 each)
//                for each row r: av = broadcast(word j of row r)      (vdpbf16ps' m32bcst operand)
//                                acc[r][0] = vdpbf16ps(acc[r][0], av, w0); acc[r][1] = ... w1
// a arrives as words in groups of 12 rows (a_group), packed once per call by the driver
// (pack_pair_group); b as pair panels (pack_pair_panel), half the bytes of float32 panels. The k
// chunks of the blocking are 128 pairs (256 k, 16 KB of a panel pair's words), so every chunk
// ends on a pair; between chunks the sums wait in float32 on the stack (exact).
//
// The entry's float32 table (sgemm_rows, for values that are not pair-exact) is the AVX-512F
// FMA-in-order tile of float8_avx512.inc, the same code as the avx512f entry's.
//
// Built twice (CMakeLists.txt, avx512bf16): natively with -mavx512bf16, and with QMM_EMULATED
// over SIMDe's AVX-512, vdpbf16ps replaced by kernels/bf16_emulation.h (the hardware's order, DAZ
// and FTZ; SIMDe's own _mm512_dpbf16_ps is not bit-exact). Level avx512_vnni, as the avx512f
// entry: it needs AVX512-BF16 besides, so it outranks that entry where the CPU has it.
#include "avx512_intrinsics.h"
#if defined(QMM_EMULATED)
#include "bf16_emulation.h"  // after SIMDe: it uses its AVX-512 types
#endif

#include <cstdint>

#include "dispatch.h"
#include "nbits_bf16_avx512.h"
#include "qgemm.h"

namespace qmm {
#include "float8_avx512.inc"
#include "pair_tile_avx512bf16.inc"

namespace {

#include "float8_encode_avx512.inc"

void pair_rows_avx512bf16(const uint32_t* a, const uint32_t* b_panels, float* y, int64_t ldy, int64_t rows,
                          int64_t cols, int64_t K) {
  blocked_rows(a, b_panels, y, ldy, rows, cols, (K + 1) / 2, kPairTiles);
}

constexpr Features kBf16Features = kAvx512Features | kFeatAvx512bf16;
#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {
    .name = "avx512bf16", .isa = Isa::kAvx512Vnni, .needs = kAvx2Features, .emulated = true, .models = kBf16Features};
#else
constexpr EntryInfo kInfo = {.name = "avx512bf16", .isa = Isa::kAvx512Vnni, .needs = kBf16Features, .emulated = false};
#endif

const Float8Dispatch kFloat8 = {.info = kInfo,
                                .a_group = kAGroup,
                                .sgemm_rows = sgemm_rows_avx512,
                                .pair_rows = pair_rows_avx512bf16,
                                .pair_order = "odd first",
                                .encode_row = float8_encode_row_avx512};

}  // namespace

// This build's MatMulNBits entry: nbits_bf16_avx512.cpp.
KernelEntries QMM_KERNELS_FN() { return {nullptr, &QMM_KERNEL_NS::kNBitsEntry, &kFloat8}; }

}  // namespace qmm
