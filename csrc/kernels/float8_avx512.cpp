// float8_avx512.cpp: the float8 path's float32 GEMM on AVX-512F: 12 x 32 register tiles of fused multiply-adds in order of k.
//
// Contract (SgemmRows in csrc/qgemm.h, kernels/sgemm_rows.inc): y[m, n] = fma(a[m, K-1], b[K-1, n],
// ... fma(a[m, 0], b[0, n], +0)), one fused multiply-add per k in order of k, so that every entry
// gives the same bits. Each output is one lane of one accumulator that sees k = 0, 1, ..., K-1 in
// turn: nothing is reassociated, k is never split into partial sums.
//
// Tile: 12 rows x 32 columns (two adjacent 16-column panels of b) in 24 zmm accumulators:
//   per k:  w0 = panel p[k][0..15], w1 = panel p+1[k][0..15]
//           for each row r: av = broadcast(a[r, k])
//                           acc[r][0] = fma(av, w0, acc[r][0]);  acc[r][1] = fma(av, w1, acc[r][1])
// a arrives interleaved by k in groups of 12 rows (kAGroup; the driver packs it once per call): a
// tile's 12 broadcasts read one run of 48 bytes per k. The last group's rows (rows % 12) take a
// tile of that many rows, an odd last panel a tile of 16 columns.
//
// Blocking: up to 48 rows (4 groups) per block; per panel pair, k in chunks of 128 swept by every
// group of the block, so the pair's chunk of b (16 KB) stays in L1 while the groups pass. The
// tiles' sums wait between chunks in a [48][32] block on the stack (a float store and load are
// exact: each sum continues from where it stopped, from the +0 it started at). No heap memory.
//
// Uses AVX-512F only. Built twice (CMakeLists.txt, avx512f): natively, and with QMM_EMULATED over
// SIMDe's portable AVX-512 intrinsics (two AVX2 FMAs per zmm FMA: the same fused operation per
// lane) for the tests on CPUs without AVX-512. Its entry is at level avx512_vnni, the level AVX-512
// CPUs run.
#if defined(QMM_EMULATED)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif

#include <cstdint>

#include "dispatch.h"
#include "qgemm.h"

namespace qmm {
namespace {

constexpr int kAGroup = 12;  // rows per tile and per group of packed a
constexpr int64_t kPanel = 16;  // columns per panel of b
constexpr int kBlockGroups = 4;  // groups per row block (48 rows)
constexpr int64_t kChunk = 128;  // k per sweep of a panel pair by the groups of a block
constexpr int64_t kPartialCols = 32;

// partial[r][16p + j] (row stride kPartialCols) = fma chain continued over k in [0, kc) with
// a[k][r] (interleaved, MR rows per k) and panel p's b[k][j] (panel p at b + p * panel_stride).
template <int MR, int NP>
void tile(const float* a, int64_t kc, const float* b, int64_t panel_stride, float* partial) {
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_loadu_ps(partial + r * kPartialCols + p * kPanel);
  const float* bp = b;
  for (int64_t k = 0; k < kc; ++k) {
    __m512 w[NP];
    for (int p = 0; p < NP; ++p) w[p] = _mm512_loadu_ps(bp + p * panel_stride);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(av, w[p], acc[r][p]);
    }
    a += MR;
    bp += kPanel;
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(partial + r * kPartialCols + p * kPanel, acc[r][p]);
}

using Tile = void (*)(const float*, int64_t, const float*, int64_t, float*);
// kTiles[NP - 1][MR - 1]
constexpr Tile kTiles[2][kAGroup] = {
    {tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>, tile<5, 1>, tile<6, 1>, tile<7, 1>, tile<8, 1>, tile<9, 1>,
     tile<10, 1>, tile<11, 1>, tile<12, 1>},
    {tile<1, 2>, tile<2, 2>, tile<3, 2>, tile<4, 2>, tile<5, 2>, tile<6, 2>, tile<7, 2>, tile<8, 2>, tile<9, 2>,
     tile<10, 2>, tile<11, 2>, tile<12, 2>},
};

int64_t min_i64(int64_t x, int64_t y) { return y < x ? y : x; }

void sgemm_rows_avx512(const float* a, const float* b_panels, float* y, int64_t ldy, int64_t rows, int64_t cols,
                       int64_t K) {
  constexpr int64_t kBlockRows = kBlockGroups * kAGroup;
  alignas(64) float partial[kBlockRows * kPartialCols];
  const int64_t panels = (cols + kPanel - 1) / kPanel, panel_stride = kPanel * K;
  for (int64_t m0 = 0; m0 < rows; m0 += kBlockRows) {
    const int64_t block_rows = min_i64(kBlockRows, rows - m0);
    for (int64_t p = 0; p < panels; p += 2) {
      const int np = panels - p >= 2 ? 2 : 1;
      for (int64_t i = 0; i < block_rows * kPartialCols; ++i) partial[i] = 0.0f;  // +0: the sums' starting value
      const float* pair = b_panels + p * panel_stride;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = min_i64(kChunk, K - k0);
        for (int64_t g = 0; g < block_rows; g += kAGroup) {
          const int64_t mr = min_i64(kAGroup, block_rows - g);
          // group at row m0 + g: [K][mr] from a + (m0 + g) * K
          kTiles[np - 1][mr - 1](a + (m0 + g) * K + k0 * mr, kc, pair + k0 * kPanel, panel_stride,
                                 partial + g * kPartialCols);
        }
      }
      const int64_t n0 = p * kPanel, ncols = min_i64(np * kPanel, cols - n0);
      for (int64_t r = 0; r < block_rows; ++r)
        for (int64_t j = 0; j < ncols; ++j) y[(m0 + r) * ldy + n0 + j] = partial[r * kPartialCols + j];
    }
  }
}

#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {.name = "avx512f", .isa = Isa::kAvx512Vnni, .needs = kAvx2Features, .emulated = true};
#else
constexpr EntryInfo kInfo = {.name = "avx512f", .isa = Isa::kAvx512Vnni, .needs = kAvx512Features, .emulated = false};
#endif

const Float8Dispatch kFloat8 = {.info = kInfo, .a_group = kAGroup, .sgemm_rows = sgemm_rows_avx512};

}  // namespace

KernelEntries QMM_KERNELS_FN() { return {nullptr, nullptr, &kFloat8}; }

}  // namespace qmm
