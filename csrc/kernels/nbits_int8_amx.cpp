// nbits_int8_amx.cpp: AMX-INT8 MatMulNBits level-4 kernel for prefill (16 rows or more, 32 x 32 blocks of tiles; tdpbsud, tdpbssd for 8-bit codes), the amx table's nbits_rows_int8 and nbits_prepare_int8, every width 2-8.
//
// A arrives quantized to int8 per row and block as ONNX Runtime does it (quantize_a_int8 in
// matmul_nbits.cpp). Per block,
//   Y += scale_a * scale_b * dot_b(qa, q) - block_sum * (scale_b * zero_point_b),
// the dot product exact in int32, the rest in float32 (docs/matmul_nbits.md, level 4), in the
// operations and order of the AVX2 and AVX-512 VNNI GEMMs (nbits_int8_avx2.cpp,
// nbits_int8_avx512vnni.cpp), so the three entries give the same bits (tests/test_matmul_nbits.py):
// per row and column, from 0, block by block, acc = fma(D, sa * sb, acc); acc = fnmadd(block_sum,
// sb * zp', acc); then + bias. The dot D: codes of 2-7 bits are uint8, so tdpbsud (int8 A x uint8
// B) gives sum qa * c and zp' = zp; 8-bit codes enter as c - 128 (int8), so tdpbssd gives
// sum qa * (c - 128), the other GEMMs' D for them, and zp' = zp - 128. Every product is exact and at
// most 127 * 255; the int32 sums wrap as theirs do.
//
// Fewer than 16 rows: the avx512_vnni build's kernels (nbits_avx512vnni.h; decode below 8 rows,
// the VNNI GEMM from 8), A prepared as they read it. From 16 rows, the driver runs tasks of 32
// columns x ranges of whole 32-row groups (kNBitsTiling, nbits_amx.h), and here:
//
//   A (nbits_prepare_int8, once per call): per group of 32 rows (rows past M zero: the driver
//     allocates them), per tile step of kk = min(block_size, 64) codes, the 32 rows' kk bytes:
//     [group][step][32 rows][kk], so an A tile (16 rows x kk bytes, stride kk) is one run of
//     16 * kk bytes.
//   B (per task, per pass of kChunk codes): the 32 columns' codes decoded by the VNNI build's panel
//     decoder (vpermt2w / vpshufb unpacking, a 16 x 16 dword transpose) as two halves of 16
//     columns, [quad][16 columns][4 codes]: a B tile (kk / 4 quads x 64 bytes, stride 64) is a run.
//   Tiles (palette 1): tmm0-3 C, rows 0-15 | 16-31 x columns 0-15 | 16-31 (16 x 16 int32);
//     tmm4-5 A rows 0-15 | 16-31 (16 x kk bytes); tmm6-7 B columns 0-15 | 16-31 (kk / 4 x 64).
//     Blocks of 16 and 32 codes configure kk = 16 or 32 (one partial-K step per block: each block's
//     sum must come out of the tiles on its own); larger blocks take block_size / 64 steps.
//   Loop: per pass of kChunk codes (whole blocks; the panel's 2 x 8 KB stay in L1), per group of 32
//     rows (16 and 1 x 2 tiles for a last group of 16 rows or fewer, 1 column tile for a last panel
//     of 16 columns or fewer), per block: zero C, per step load B (2 tiles), A (1, 2) and
//     tdp (2, 4); store C to a 4 KB buffer; the float epilogue, 16 columns per zmm, on the real
//     rows into the task's float32 accumulators [rows][32]. Y is written at the end of the panel.
//
// The tile configuration (kk's) is loaded at the start of each task where the thread's differs
// (amx_config.h): qgemm_amx.cpp's differs from ours for blocks of 16 and 32.
//
// Built twice (CMakeLists.txt): natively with -mamx-tile -mamx-int8 -mavx512*, and with
// QMM_EMULATED over SIMDe's AVX-512 and kernels/amx_emulation.h's tiles (its tile state shared
// with qgemm_amx.cpp, as the hardware's) for the tests on any CPU with AVX2. Everything is internal
// except the two functions of nbits_amx.h.
#include "avx512_intrinsics.h"
#if defined(QMM_EMULATED)
#include "amx_emulation.h"  // after SIMDe: it replaces the AMX intrinsics
#endif

#include <cstdint>
#include <cstring>

#include "amx_config.h"
#include "matmul_nbits.h"
#include "nbits_amx.h"
#include "nbits_avx2_common.h"
#include "nbits_avx512vnni.h"

namespace qmm {
namespace {

#if defined(QMM_EMULATED)
namespace vnni = ::qmm::avx512_vnni_emulated;
#else
namespace vnni = ::qmm::avx512_vnni;
#endif

constexpr int64_t kGroup = 32;  // rows per group of A: tmm4, tmm5
constexpr int64_t kPanel = 32;  // columns per panel: tmm6, tmm7
constexpr int64_t kChunk = 512;  // codes per pass over the groups (at least one block)
constexpr int64_t kMinRows = QMM_KERNEL_NS::kNBitsTiling.min_rows;
static_assert(QMM_KERNEL_NS::kNBitsTiling.row_group == kGroup && QMM_KERNEL_NS::kNBitsTiling.columns == kPanel);
static_assert(kMinRows == 16, "below one A tile of rows, the VNNI kernels");

// k per tile step: a block of 16 or 32 codes, else 64 (a tile row's bytes).
inline int64_t step_codes(int64_t block_size) { return block_size < 64 ? block_size : 64; }

// Palette 1: tmm0-3 16 rows x 64 bytes (C), tmm4-5 16 rows x kk bytes (A), tmm6-7 kk / 4 rows x 64
// bytes (B); the rest zero.
constexpr TileConfig make_config(int kk) {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? kk : 64);
    config.rows[t] = static_cast<uint8_t>(t >= 6 ? kk / 4 : 16);
  }
  return config;
}
constexpr TileConfig kConfig16 = make_config(16), kConfig32 = make_config(32), kConfig64 = make_config(64);

// tmm C += tmm A . tmm B in group_blocks: int8 A with uint8 codes, or with int8 codes (8 bits,
// c - 128). A macro: GCC's tile intrinsics paste the tile numbers into assembly, so they must be
// literals (template parameters are not).
#define QMM_TILE_DOT(C, A, B) \
  do {                        \
    if constexpr (Signed8) {  \
      _tile_dpbssd(C, A, B);  \
    } else {                  \
      _tile_dpbsud(C, A, B);  \
    }                         \
  } while (0)

// Blocks [b0, b1) of one group of A (its first `rows` rows real, 16 * RH in the tiles) against a
// panel pass (16 * CH columns; codes from k_first, half_bytes between the halves), into acc
// ([32 rows][32 columns] float32).
template <int RH, int CH, bool Signed8>
void group_blocks(const int8_t* group, int64_t rows, const float* sa, const float* bsum, int64_t kb, int64_t bs,
                  const uint8_t* panel, int64_t half_bytes, int64_t k_first, const float* sb, const float* szb,
                  int64_t b0, int64_t b1, float* acc) {
  const int64_t kk = step_codes(bs);
  alignas(64) int32_t dots[kGroup * kPanel];
  constexpr int64_t kDotStride = kPanel * sizeof(int32_t);
  for (int64_t b = b0; b < b1; ++b) {
    _tile_zero(0);
    if constexpr (CH == 2) _tile_zero(1);
    if constexpr (RH == 2) {
      _tile_zero(2);
      if constexpr (CH == 2) _tile_zero(3);
    }
    for (int64_t k = b * bs; k < (b + 1) * bs; k += kk) {
      const int8_t* a = group + k * kGroup;  // step k / kk: 32 rows x kk bytes
      const uint8_t* codes = panel + (k - k_first) / 4 * 64;
      _tile_loadd(6, codes, 64);
      if constexpr (CH == 2) _tile_loadd(7, codes + half_bytes, 64);
      _tile_loadd(4, a, kk);
      QMM_TILE_DOT(0, 4, 6);
      if constexpr (CH == 2) QMM_TILE_DOT(1, 4, 7);
      if constexpr (RH == 2) {
        _tile_loadd(5, a + 16 * kk, kk);
        QMM_TILE_DOT(2, 5, 6);
        if constexpr (CH == 2) QMM_TILE_DOT(3, 5, 7);
      }
    }
    _tile_stored(0, dots, kDotStride);
    if constexpr (CH == 2) _tile_stored(1, dots + 16, kDotStride);
    if constexpr (RH == 2) {
      _tile_stored(2, dots + 16 * kPanel, kDotStride);
      if constexpr (CH == 2) _tile_stored(3, dots + 16 * kPanel + 16, kDotStride);
    }
    __m512 scale_b[CH], scaled_zp[CH];
    for (int h = 0; h < CH; ++h) {
      scale_b[h] = _mm512_loadu_ps(sb + b * kPanel + 16 * h);
      scaled_zp[h] = _mm512_loadu_ps(szb + b * kPanel + 16 * h);
    }
    for (int64_t r = 0; r < rows; ++r) {  // the padding rows' sums are dropped
      const __m512 scale_a = _mm512_set1_ps(sa[r * kb + b]), block_sum = _mm512_set1_ps(bsum[r * kb + b]);
      for (int h = 0; h < CH; ++h) {
        float* out = acc + r * kPanel + 16 * h;
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(dots + r * kPanel + 16 * h));
        __m512 f = _mm512_loadu_ps(out);
        f = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale_a, scale_b[h]), f);
        f = _mm512_fnmadd_ps(block_sum, scaled_zp[h], f);
        _mm512_storeu_ps(out, f);
      }
    }
  }
}

#undef QMM_TILE_DOT

template <bool Signed8>
void tiles(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, M = a.M;
  const int64_t chunk = max_i64(kChunk, bs);  // whole blocks, a multiple of 64
  const int64_t half_bytes = chunk / 4 * 64;  // one 16-column half of a pass's panel
  const int64_t groups = (M + kGroup - 1) / kGroup;
  const int64_t kk = step_codes(bs);
  configure_tiles(kk == 16 ? kConfig16 : kk == 32 ? kConfig32 : kConfig64);
  thread_local Scratch panel_storage, sb_storage, szb_storage, acc_storage;
  // Plain pointers: thread_local storage is looked up on every access the compiler cannot hoist.
  uint8_t* const panel = panel_storage.get<uint8_t>(2 * half_bytes);
  float* const sb = sb_storage.get<float>(kb * kPanel);
  float* const szb = szb_storage.get<float>(kb * kPanel);
  float* const acc = acc_storage.get<float>(groups * kGroup * kPanel);
  for (int64_t p0 = n0; p0 < n1; p0 += kPanel) {
    const int64_t cols = min_i64(kPanel, n1 - p0);
    zero_floats(sb, kb * kPanel);  // columns past the panel's keep scale 0
    zero_floats(szb, kb * kPanel);
    zero_floats(acc, groups * kGroup * kPanel);
    block_scales(w, p0, cols, kPanel, Signed8 ? 128.0f : 0.0f, sb, szb);  // from the panels of a packed weight
    for (int64_t k0 = 0; k0 < padded; k0 += chunk) {
      const int64_t k1 = min_i64(padded, k0 + chunk);
      vnni::nbits_decode_panel16(w, p0, min_i64(cols, 16), k0, k1, panel);
      if (cols > 16) vnni::nbits_decode_panel16(w, p0 + 16, cols - 16, k0, k1, panel + half_bytes);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t rows = min_i64(kGroup, M - g * kGroup);
        const int8_t* group = a.qa + g * kGroup * padded;
        const float *sa = a.scale + g * kGroup * kb, *bsum = a.block_sum + g * kGroup * kb;
        float* group_acc = acc + g * kGroup * kPanel;
        const int64_t b0 = k0 / bs, b1 = k1 / bs;
        if (rows > 16 && cols > 16)
          group_blocks<2, 2, Signed8>(group, rows, sa, bsum, kb, bs, panel, half_bytes, k0, sb, szb, b0, b1, group_acc);
        else if (rows > 16)
          group_blocks<2, 1, Signed8>(group, rows, sa, bsum, kb, bs, panel, half_bytes, k0, sb, szb, b0, b1, group_acc);
        else if (cols > 16)
          group_blocks<1, 2, Signed8>(group, rows, sa, bsum, kb, bs, panel, half_bytes, k0, sb, szb, b0, b1, group_acc);
        else
          group_blocks<1, 1, Signed8>(group, rows, sa, bsum, kb, bs, panel, half_bytes, k0, sb, szb, b0, b1, group_acc);
      }
    }
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float y = acc[r * kPanel + c];
        Y[r * w.N + p0 + c] = bias ? y + bias[p0 + c] : y;
      }
  }
}

}  // namespace

namespace QMM_KERNEL_NS {

// Y[:, n0:n1) for the a.M rows of a: from 16 rows, tiles (a in the layout of nbits_prepare_int8
// below, rows up to a multiple of 32 there); below, the VNNI kernels.
void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  if (a.M < kMinRows) return vnni::nbits_rows_int8(a, w, n0, n1, bias, Y);
  if (w.bits == 8) return tiles<true>(a, w, n0, n1, bias, Y);
  tiles<false>(a, w, n0, n1, bias, Y);
}

// From 16 rows: every group of 32 rows (the last one padded with the zero rows the driver
// allocates) as [step][32 rows][kk bytes], within its own rows' bytes. Below: as the VNNI kernels read it.
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w) {
  if (M < kMinRows) return vnni::nbits_prepare_int8(qa, M, w);
  const int64_t padded = w.k_blocks * w.block_size, kk = step_codes(w.block_size);
  // thread_local like the kernels' buffers: a local one would need an exception cleanup.
  thread_local Scratch copy_storage;
  int8_t* const copy = copy_storage.get<int8_t>(kGroup * padded);
  for (int64_t g = 0; g < M; g += kGroup) {
    int8_t* rows = qa + g * padded;
    std::memcpy(copy, rows, static_cast<size_t>(kGroup * padded));
    for (int64_t s = 0; s < padded / kk; ++s)
      for (int64_t r = 0; r < kGroup; ++r)
        std::memcpy(rows + (s * kGroup + r) * kk, copy + r * padded + s * kk, static_cast<size_t>(kk));
  }
}

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
