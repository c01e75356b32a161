// qgemm_avx512vnni.cpp: AVX-512 VNNI int8 GEMM micro-kernel (vpdpbusd on the int8-quads layout) and a 16-lane ONNX Runtime epilogue.
//
// Layout kLayoutQuads (csrc/qgemm.h): per k-group of 4, A holds one int32 of four uint8 per row
// (row-major) and a 32-column B panel 128 bytes of int8, column j's four bytes at 4j. The stored
// values carry the layout's offsets (signed a + 128, unsigned b - 128), which the driver turns into
// zero-point terms, so vpdpbusd's uint8 x int8 products are exact for every signedness combination:
// |a' b'| <= 255 * 128, and four of them summed into an int32 lane. uint8 a x int8 b is stored as
// given: the driver reads such an A in place.
//
// Micro-tile (kernels/vnni_rows.inc, shared with the AMX file's few-row path): MR (<= 8) rows x 32
// columns in 2 * MR zmm accumulators:
//   per k-group g:  b0 = B[g][cols 0..15], b1 = B[g][cols 16..31]          (64 bytes each)
//                   for each row r: a = broadcast(A[r][g]);  acc[r][0] += dpbusd(a, b0); acc[r][1] += dpbusd(a, b1)
// With one or two rows, the k loop keeps two sets of accumulators (even and odd g) so that
// consecutive vpdpbusd do not wait on each other.
//
// Built twice (CMakeLists.txt): natively with -mavx512*, and with QMM_EMULATED over SIMDe's
// portable AVX-512 intrinsics for the tests on CPUs without AVX-512.
#include "avx512_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dispatch.h"
#include "nbits_avx2.h"
#include "nbits_avx512vnni.h"
#include "nbits_f32_avx512.h"
#include "qgemm.h"
#include "requantize.h"

namespace qmm {
namespace {

#include "vnni_rows.inc"

// kLayoutQuads' A: k-quad Q of row r at r * lda + Q (row-major).
struct QuadsA {
  int64_t lda;
  int64_t at(int64_t quad, int r) const { return r * lda + quad; }
};

void kernel_vnni(const int32_t* a, int64_t lda, int64_t rows, const int8_t* b_panel, int64_t g0, int64_t g1, bool,
                 bool accumulate, int32_t* c, int64_t ldc) {
  vnni_rows_upto8(a, QuadsA{lda}, rows, b_panel, g0, g1, accumulate, c, ldc);
}

void kernel_vnni_taps(const uint8_t* x, const int32_t* offsets, int64_t taps, const uint8_t* pad, int64_t rows,
                      int64_t quads_per_tap, const int8_t* b_panel, int32_t* c, int64_t ldc) {
  vnni_rows_taps_upto8(x, offsets, taps, pad, rows, quads_per_tap, b_panel, c, ldc);
}

#include "requantize_avx512.inc"
#include "small_product_avx512.inc"
#include "vnni_requantized.inc"

#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {.name = "avx512_vnni", .isa = Isa::kAvx512Vnni, .needs = kAvx2Features, .emulated = true};
#else
constexpr EntryInfo kInfo = {
    .name = "avx512_vnni", .isa = Isa::kAvx512Vnni, .needs = kAvx512Features | kFeatAvx512vnni, .emulated = false};
#endif

const QGemmDispatch kQGemm = {
    .info = kInfo,
    .layout = &kQuadsLayout,
    .pack_a = pack_a_quads,
    .pack_b_panels = pack_b_quads,
    .kernel = kernel_vnni,
    .requantize_onnxruntime = requantize_rows_avx512,
    .begin_task = nullptr,
    .kernel_taps = kernel_vnni_taps,
    .small_product = small_product_avx512,
    .kernel_requantized = kernel_vnni_requantized,
    .kernel_taps_requantized = kernel_vnni_taps_requantized,
};

// MatMulNBits: level 4 on vpdpbusd (nbits_int8_avx512vnni.cpp), levels 0-3 on AVX-512F FMAs
// (nbits_f32_avx512.cpp), both of this build.
const NBitsDispatch kNBits = {
    .info = kInfo,
    .rows = QMM_KERNEL_NS::nbits_rows_f32,
    .rows_prefill_columns = QMM_KERNEL_NS::kNBitsF32PrefillColumns,
    .rows_int8 = QMM_KERNEL_NS::nbits_rows_int8,
    .prepare_int8 = QMM_KERNEL_NS::nbits_prepare_int8,
    .prepare_f32 = QMM_KERNEL_NS::nbits_prepare_f32,
    .round_operands = avx2::nbits_round_operands,
    .quantize_a = avx2::nbits_quantize_a,
    .int8_layout = &kNBitsQuads16,  // read below 8 rows (nbits_packed_avx512vnni.cpp)
    .f32_layout = &kNBitsQuads16,  // levels 0/1: nbits_packed_f32_avx512.cpp
};

}  // namespace

KernelEntries QMM_KERNELS_FN() { return {&kQGemm, &kNBits, nullptr}; }

}  // namespace qmm
