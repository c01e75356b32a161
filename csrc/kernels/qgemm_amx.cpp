// qgemm_amx.cpp: AMX-INT8 int8 GEMM micro-kernel (tdpbusd on the int8-tiles layout), an AVX-512 VNNI path for fewer than 16 rows, the 16-lane ONNX Runtime epilogue, and the amx table's entries (its MatMulNBits kernel: nbits_int8_amx.cpp).
//
// Layout kLayoutTiles (csrc/qgemm.h): the stored values of kLayoutQuads (signed a + 128, unsigned
// b - 128, which the driver turns into zero-point terms), so that tdpbusd's uint8 A x int8 B
// products are exact for every signedness combination, in k-groups of 64:
//   A, per group of 32 rows and k-group G: 32 x 64 bytes, row r's at 64r (int32 G * 512 + 16r + q
//      holds row r's k-quad q);
//   B, per 32-column panel and k-group G: 16 k-quads of 128 bytes, column j's four bytes at 4j.
//
// Kernel, 16 to 32 rows x one 32-column panel: every tile 16 rows x 64 bytes (palette 1)
//   tmm0 tmm1   C rows 0-15  x columns 0-15 | 16-31   (int32)
//   tmm2 tmm3   C rows 16-31 x columns 0-15 | 16-31
//   tmm4 tmm5   A rows 0-15 | 16-31 of k-group G: 16 rows x 64 uint8, stride 64
//   tmm6 tmm7   B columns 0-15 | 16-31 of k-group G: 16 k-quads x (16 columns x 4 int8), stride 128
//   per k-group: C[i][j] += A[i] . B[j] (tdpbusd), four of them (two with 16 rows or fewer).
// C goes to c directly when the tiles cover exactly `rows` rows, else through a 32 x 32 buffer.
// Fewer than 16 rows (M = 1 decode, say) would waste most of a tile's work: those take vpdpbusd
// on the same layout (B's k-quads are kLayoutQuads' 128-byte groups), up to 8 rows at a time.
//
// The tile configuration is loaded whenever the thread's current one differs from ours, checked
// (_tile_storeconfig) at the start of each task (the entry's begin_task, which the driver calls
// before a task's kernel calls), not once per thread: other AMX code on the same thread (ONNX
// Runtime's, in the same process, or our MatMulNBits kernel's, whose configuration differs) may have
// loaded its own between two of our tasks (amx_config.h). Linux's permission for the tile data
// (arch_prctl) is asked for at feature detection (csrc/cpu_features.cpp).
//
// Built twice (CMakeLists.txt): natively with -mamx-tile -mamx-int8 -mavx512*, and with
// QMM_EMULATED over SIMDe's AVX-512 and kernels/amx_emulation.h's tiles, for the tests on any
// CPU with AVX2.
#include "avx512_intrinsics.h"
#if defined(QMM_EMULATED)
#define QMM_AMX_EMULATION_STATE  // the build's one tile state is defined here (amx_emulation.h)
#include "amx_emulation.h"  // last: it replaces the AMX intrinsics
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "amx_config.h"
#include "dispatch.h"
#include "nbits_amx.h"
#include "nbits_avx2.h"
#include "nbits_f32_avx512.h"
#include "qgemm.h"
#include "requantize.h"

namespace qmm {
namespace {

constexpr int64_t kMr = 32, kNr = 32;  // kTilesLayout
constexpr int64_t kAGroupInt32s = kMr * 16, kBGroupBytes = kNr * 64;  // per k-group of 64
constexpr int64_t kQuadBytes = 128;  // one k-quad of a B panel
constexpr int64_t kARowInt32s = 16;  // one row of an A k-group

// Palette 1, tiles 0-7 of 16 rows x 64 bytes, the rest zero (amx_config.h).
constexpr TileConfig kTileConfig = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

void configure_tiles() { configure_tiles(kTileConfig); }

// Rows [0, 16 * Halves) of the A group at a times the B panel at b over k-groups [g0, g1), into
// c (row stride ldc, int32): C tiles stored straight into c.
template <int Halves>
void amx_tiles(const int32_t* a, const int8_t* b, int64_t g0, int64_t g1, bool accumulate, int32_t* c, int64_t ldc) {
  const int64_t stride = ldc * static_cast<int64_t>(sizeof(int32_t));
  if (accumulate) {
    _tile_loadd(0, c, stride);
    _tile_loadd(1, c + 16, stride);
    if constexpr (Halves == 2) {
      _tile_loadd(2, c + 16 * ldc, stride);
      _tile_loadd(3, c + 16 * ldc + 16, stride);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (Halves == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  for (int64_t g = g0; g < g1; ++g) {
    const auto* ag = reinterpret_cast<const int8_t*>(a + g * kAGroupInt32s);
    const int8_t* bg = b + g * kBGroupBytes;
    _tile_loadd(6, bg, kQuadBytes);
    _tile_loadd(7, bg + 64, kQuadBytes);
    _tile_loadd(4, ag, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    if constexpr (Halves == 2) {
      _tile_loadd(5, ag + 16 * 64, 64);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
  }
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  if constexpr (Halves == 2) {
    _tile_stored(2, c + 16 * ldc, stride);
    _tile_stored(3, c + 16 * ldc + 16, stride);
  }
}

// 16 <= rows <= 32.
void amx_block(const int32_t* a, int64_t rows, const int8_t* b, int64_t g0, int64_t g1, bool accumulate, int32_t* c,
               int64_t ldc) {
  if (rows == 16) return amx_tiles<1>(a, b, g0, g1, accumulate, c, ldc);
  if (rows == 32) return amx_tiles<2>(a, b, g0, g1, accumulate, c, ldc);
  alignas(64) int32_t buffer[kMr * kNr];
  if (accumulate)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(buffer + r * kNr, c + r * ldc, kNr * sizeof(int32_t));
  amx_tiles<2>(a, b, g0, g1, accumulate, buffer, kNr);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * ldc, buffer + r * kNr, kNr * sizeof(int32_t));
}

#include "vnni_rows.inc"

// kLayoutTiles' A: k-quad Q of row r in k-group Q / 16, at row r's 16 int32s of that group.
struct TilesA {
  int64_t at(int64_t quad, int r) const { return quad / 16 * kAGroupInt32s + r * kARowInt32s + quad % 16; }
};

void kernel_amx(const int32_t* a, int64_t, int64_t rows, const int8_t* b_panel, int64_t g0, int64_t g1, bool,
                bool accumulate, int32_t* c, int64_t ldc) {
  if (rows >= 16) return amx_block(a, rows, b_panel, g0, g1, accumulate, c, ldc);
  if (rows > 8) {
    vnni_rows_upto8(a, TilesA{}, 8, b_panel, 16 * g0, 16 * g1, accumulate, c, ldc);
    return vnni_rows_upto8(a + 8 * kARowInt32s, TilesA{}, rows - 8, b_panel, 16 * g0, 16 * g1, accumulate, c + 8 * ldc,
                           ldc);
  }
  vnni_rows_upto8(a, TilesA{}, rows, b_panel, 16 * g0, 16 * g1, accumulate, c, ldc);
}

#include "requantize_avx512.inc"
#include "small_product_avx512.inc"

#if defined(QMM_EMULATED)
constexpr EntryInfo kInfo = {.name = "amx", .isa = Isa::kAmx, .needs = kAvx2Features, .emulated = true};
#else
constexpr EntryInfo kInfo = {.name = "amx",
                             .isa = Isa::kAmx,
                             .needs = kAvx512Features | kFeatAvx512vnni | kFeatAmxTile | kFeatAmxInt8,
                             .emulated = false};
#endif

const QGemmDispatch kQGemm = {
    .info = kInfo,
    .layout = &kTilesLayout,
    .pack_a = pack_a_tiles,
    .pack_b_panels = pack_b_tiles,
    .kernel = kernel_amx,
    .requantize_onnxruntime = requantize_rows_avx512,
    .begin_task = configure_tiles,
    .small_product = small_product_avx512,  // (on vpdpbusd: no tiles, no configuration)
};

// MatMulNBits: level 4 on the tiles for 16 rows or more (nbits_int8_amx.cpp, which takes the
// avx512_vnni build's kernels below that); levels 0-3 are the avx512_vnni build's AVX-512 float
// kernels (nbits_f32_avx512.h), as in the avx512_vnni entry, of this build's kind. The needs above
// cover both builds' code: the native entry's include AVX-512 VNNI, the emulated entry's
// kAvx2Features is what the emulated builds are compiled for.
#if defined(QMM_EMULATED)
namespace f32 = ::qmm::avx512_vnni_emulated;
#else
namespace f32 = ::qmm::avx512_vnni;
#endif

const NBitsDispatch kNBits = {
    .info = kInfo,
    .rows = f32::nbits_rows_f32,
    .rows_prefill_columns = f32::kNBitsF32PrefillColumns,
    .rows_int8 = QMM_KERNEL_NS::nbits_rows_int8,
    .prepare_int8 = QMM_KERNEL_NS::nbits_prepare_int8,
    .prepare_f32 = f32::nbits_prepare_f32,
    .round_operands = avx2::nbits_round_operands,
    .quantize_a = avx2::nbits_quantize_a,
    .int8_tiling = QMM_KERNEL_NS::kNBitsTiling,
    .int8_layout = &kNBitsQuads16,  // read by the VNNI kernels below 8 rows
    .f32_layout = &kNBitsQuads16,  // levels 0/1: nbits_packed_f32_avx512.cpp
};

}  // namespace

KernelEntries QMM_KERNELS_FN() { return {&kQGemm, &kNBits, nullptr}; }

}  // namespace qmm
