// float8_avx512.cpp: the float8 path's float32 GEMM on AVX-512F: 12 x 32 register tiles of fused multiply-adds in order of k.
//
// Contract (SgemmRows in csrc/qgemm.h, kernels/sgemm_rows.inc): y[m, n] = fma(a[m, K-1], b[K-1, n],
// ... fma(a[m, 0], b[0, n], +0)), one fused multiply-add per k in order of k, so that every entry
// gives the same bits. The tile (12 rows x 32 columns in 24 zmm accumulators, a interleaved by k
// in groups of 12 rows) and the cache blocking are in kernels/float8_avx512.inc, which the
// AVX512-BF16 entry (float8_avx512bf16.cpp) shares for its float32 operands.
//
// Uses AVX-512F only. Built twice (CMakeLists.txt, avx512f): natively, and with QMM_EMULATED over
// SIMDe's portable AVX-512 intrinsics (two AVX2 FMAs per zmm FMA: the same fused operation per
// lane) for the tests on CPUs without AVX-512. Its entry is at level avx512_vnni, the level AVX-512
// CPUs run; on a CPU with AVX512-BF16 the BF16 entry of that level, which needs more features,
// outranks it (csrc/dispatch.h).
#include "avx512_intrinsics.h"

#include <cstdint>

#include "dispatch.h"
#include "qgemm.h"

namespace qmm {
#include "float8_avx512.inc"

namespace {

#include "float8_encode_avx512.inc"

#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {
    .name = "avx512f", .isa = Isa::kAvx512Vnni, .needs = kAvx2Features, .emulated = true, .models = kAvx512Features};
#else
constexpr EntryInfo kInfo = {.name = "avx512f", .isa = Isa::kAvx512Vnni, .needs = kAvx512Features, .emulated = false};
#endif

const Float8Dispatch kFloat8 = {
    .info = kInfo, .a_group = kAGroup, .sgemm_rows = sgemm_rows_avx512, .encode_row = float8_encode_row_avx512};

}  // namespace

KernelEntries QMM_KERNELS_FN() { return {nullptr, nullptr, &kFloat8}; }

}  // namespace qmm
