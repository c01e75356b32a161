// float8_amx.cpp: the float8 path's GEMM on AMX-BF16: tdpbf16ps over bfloat16 pairs in 32 x 32 blocks of four C tiles (also MatMulNBits level 3's, nbits_bf16_amx.cpp), and the amxbf16 build's entries.
//
// Contract (PairRows in csrc/qgemm.h), pair group 1: a as rows of words, row r's word j (k = 2j in
// the low half, k = 2j + 1 in the high half) at a + r * KP + j, KP = ceil(K / 2); b as the pair
// panels of the other pair tables ([KP][16] words per 16-column panel). The driver uses this table
// only when every value is pair-exact (docs/quantization.md, "bfloat16 pairs"): every product is
// exact in float32 and no denormal arises, so DAZ and FTZ never apply.
// Order ("tiles of 32 k"), tdpbf16ps's per the SDM: y[m, n] starts at +0 and, for each chunk of 16
// pairs (k0 = 32c, 32c + 1, ..., 32c + 31, cut at K),
//   e = +0 + a[m, k0] b[k0, n] + a[m, k0+2] b[k0+2, n] + ...      (one rounding per addition)
//   o = +0 + a[m, k0+1] b[k0+1, n] + a[m, k0+3] b[k0+3, n] + ...
//   y = f32(y + f32(e + o))
// The last chunk's missing pairs (and K odd's last high half) are +0 words: adding +0 products to
// sums that are never -0 changes nothing, so padding is invisible.
//
// Kernel: tiles of 16 rows x 64 bytes (palette 1), per 32-row x 32-column block:
//   tmm0 tmm1   C rows 0-15  x columns 0-15 | 16-31   (float32)
//   tmm2 tmm3   C rows 16-31 x columns 0-15 | 16-31
//   tmm4 tmm5   A rows 0-15 | 16-31, 16 pairs: 16 rows x 16 words, stride KP words
//   tmm6 tmm7   B panels p | p + 1, 16 pairs: 16 pair rows x 16 words, stride 64 bytes
//   per chunk of 16 pairs: C[i][j] = tdpbf16ps(C[i][j], A[i], B[j]), four of them.
// The C tiles hold their sums over all of k and are stored once. Rows past the block's (fewer
// than 32 rows: the last block, or M = 1), the last chunk's pairs past KP and a missing second
// panel come from zeroed 16 x 16-word buffers on the stack, so every tile has one shape and
// one configuration serves the whole call; C tiles that do not fit y go through a buffer.
//
// The float32 table (values that are not pair-exact) is the AVX-512F FMA-in-order tile of
// float8_avx512.inc, as in the avx512f entry. The tile configuration is loaded at the start of each
// call where the thread's differs (amx_config.h: other AMX code may run between our calls).
//
// Built twice (CMakeLists.txt, amxbf16): natively with -mamx-tile -mamx-bf16 -mavx512*, and with
// QMM_EMULATED over SIMDe's AVX-512 and kernels/amx_emulation.h (tdpbf16ps from the SDM's
// pseudo-code); the entry's self-test checks the order on the hardware before its first use.
#include "avx512_intrinsics.h"
#if defined(QMM_EMULATED)
#define QMM_AMX_EMULATION_STATE  // this build's tile state (amx_emulation.h)
#include "amx_emulation.h"  // last: it replaces the AMX intrinsics
#endif

#include <cstdint>
#include <cstring>

#include "amx_config.h"
#include "dispatch.h"
#include "nbits_bf16_amx.h"
#include "qgemm.h"

namespace qmm {
#include "float8_avx512.inc"

namespace {

constexpr int64_t kPairsPerTile = 16;  // one A tile row: 16 words of two bfloat16
constexpr int64_t kTileWords = 16 * kPairsPerTile;

constexpr TileConfig kTileConfig = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

// A 16 x 16-word tile's source: straight from memory (stride in bytes) or copied into `pad`
// (zeros past `rows` rows and `words` words).
struct TileSource {
  const uint32_t* base;
  int64_t stride;
};

TileSource tile_source(const uint32_t* src, int64_t src_stride_words, int64_t rows, int64_t words, uint32_t* pad) {
  if (rows == 16 && words == kPairsPerTile) return {src, src_stride_words * 4};
  std::memset(pad, 0, kTileWords * sizeof(uint32_t));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(pad + r * kPairsPerTile, src + r * src_stride_words, words * 4);
  return {pad, 64};
}

// y[0 .. rows) x [0 .. cols) (rows <= 32, cols <= 32) over all KP pairs: Halves row tiles (rows 0-15,
// 16-31), Panels column tiles. a: the block's first row; b: its first panel.
template <int Halves, int Panels>
void amx_block(const uint32_t* a, int64_t KP, int64_t rows, const uint32_t* b, float* y, int64_t ldy, int64_t cols) {
  alignas(64) uint32_t pad_a[2][kTileWords], pad_b[2][kTileWords];
  const int64_t panel_words = KP * 16;
  _tile_zero(0);
  if constexpr (Panels == 2) _tile_zero(1);
  if constexpr (Halves == 2) {
    _tile_zero(2);
    if constexpr (Panels == 2) _tile_zero(3);
  }
  for (int64_t j0 = 0; j0 < KP; j0 += kPairsPerTile) {
    const int64_t words = KP - j0 < kPairsPerTile ? KP - j0 : kPairsPerTile;
    const TileSource a0 = tile_source(a + j0, KP, rows < 16 ? rows : 16, words, pad_a[0]);
    const TileSource b0 = tile_source(b + j0 * 16, 16, words, 16, pad_b[0]);
    _tile_loadd(4, a0.base, a0.stride);
    _tile_loadd(6, b0.base, b0.stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Panels == 2) {
      const TileSource b1 = tile_source(b + panel_words + j0 * 16, 16, words, 16, pad_b[1]);
      _tile_loadd(7, b1.base, b1.stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (Halves == 2) {
      const TileSource a1 = tile_source(a + 16 * KP + j0, KP, rows - 16, words, pad_a[1]);
      _tile_loadd(5, a1.base, a1.stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (Panels == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  // C tiles straight into y when they fit, else through a buffer.
  const int64_t stride = ldy * static_cast<int64_t>(sizeof(float));
  if (rows == 16 * Halves && cols == 16 * Panels) {
    _tile_stored(0, y, stride);
    if constexpr (Panels == 2) _tile_stored(1, y + 16, stride);
    if constexpr (Halves == 2) {
      _tile_stored(2, y + 16 * ldy, stride);
      if constexpr (Panels == 2) _tile_stored(3, y + 16 * ldy + 16, stride);
    }
    return;
  }
  alignas(64) float c[32 * 32];
  _tile_stored(0, c, 32 * sizeof(float));
  if constexpr (Panels == 2) _tile_stored(1, c + 16, 32 * sizeof(float));
  if constexpr (Halves == 2) {
    _tile_stored(2, c + 16 * 32, 32 * sizeof(float));
    if constexpr (Panels == 2) _tile_stored(3, c + 16 * 32 + 16, 32 * sizeof(float));
  }
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * ldy, c + r * 32, cols * sizeof(float));
}

}  // namespace

void QMM_KERNEL_NS::pair_rows_amx(const uint32_t* a, const uint32_t* b_panels, float* y, int64_t ldy, int64_t rows,
                                  int64_t cols, int64_t K) {
  configure_tiles(kTileConfig);
  const int64_t KP = (K + 1) / 2, panel_words = KP * 16;
  for (int64_t m0 = 0; m0 < rows; m0 += 32) {
    const int64_t mr = rows - m0 < 32 ? rows - m0 : 32;
    const uint32_t* am = a + m0 * KP;
    for (int64_t n0 = 0; n0 < cols; n0 += 32) {
      const int64_t nc = cols - n0 < 32 ? cols - n0 : 32;
      const uint32_t* bp = b_panels + n0 / 16 * panel_words;
      float* yb = y + m0 * ldy + n0;
      if (mr > 16) {
        if (nc > 16) amx_block<2, 2>(am, KP, mr, bp, yb, ldy, nc);
        else amx_block<2, 1>(am, KP, mr, bp, yb, ldy, nc);
      } else {
        if (nc > 16) amx_block<1, 2>(am, KP, mr, bp, yb, ldy, nc);
        else amx_block<1, 1>(am, KP, mr, bp, yb, ldy, nc);
      }
    }
  }
}

namespace {

#include "float8_encode_avx512.inc"

#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {.name = "amx",
                             .isa = Isa::kAmx,
                             .needs = kAvx2Features,
                             .emulated = true,
                             .models = kAvx512Features | kFeatAmxTile | kFeatAmxBf16};
#else
constexpr EntryInfo kInfo = {
    .name = "amx", .isa = Isa::kAmx, .needs = kAvx512Features | kFeatAmxTile | kFeatAmxBf16, .emulated = false};
#endif

const Float8Dispatch kFloat8 = {.info = kInfo,
                                .a_group = kAGroup,
                                .sgemm_rows = sgemm_rows_avx512,
                                .pair_rows = QMM_KERNEL_NS::pair_rows_amx,
                                .pair_order = "tiles of 32 k",
                                .pair_group = 1,
                                .encode_row = float8_encode_row_avx512};

}  // namespace

// This build's MatMulNBits entry: nbits_bf16_amx.cpp.
KernelEntries QMM_KERNELS_FN() { return {nullptr, &QMM_KERNEL_NS::kNBitsEntry, &kFloat8}; }

}  // namespace qmm
