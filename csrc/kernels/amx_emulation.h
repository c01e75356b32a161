// amx_emulation.h: a scalar emulation of the AMX-TILE, AMX-INT8 and AMX-BF16 intrinsics, for the kernel builds with QMM_EMULATED.
//
// Written from Intel's pseudo-code of the instructions (the intrinsics guide and the SDM):
//   _tile_loadconfig / _tile_storeconfig   LDTILECFG / STTILECFG, the 64-byte palette-1 configuration:
//       byte 0 palette, 1 start_row, 16 + 2t tile t's colsb (bytes per row, uint16), 48 + t its rows;
//       the rest reserved (zero). Palette 0 is the INIT state (as _tile_release).
//   _tile_release                          TILERELEASE: INIT state, tiles unconfigured and zeroed.
//   _tile_zero(t)                          TILEZERO.
//   _tile_loadd / _tile_stream_loadd(t, base, stride)   TILELOADD(T1): row r's colsb bytes from
//       base + r * stride; the rest of the tile (past colsb, past rows) zeroed.
//   _tile_stored(t, base, stride)          TILESTORED: rows x colsb bytes to base + r * stride.
//   _tile_dpb{ss,su,us,uu}d(dst, a, b)      TDPB*D: for each row m of dst and dword n < dst.colsb / 4,
//       dst[m].dword[n] += sum over k < a.colsb / 4 of the four byte products of a[m].dword[k] and
//       b[k].dword[n], a's bytes signed for s? and b's for ?s; 32-bit wrapping sums, as the
//       hardware; the rest of dst zeroed.
//   _tile_dpbf16ps(dst, a, b)              TDPBF16PS, as the SDM's pseudo-code has it since its
//       2023 revisions: for each row m of dst, two float32 sums per column n < dst.colsb / 4 start
//       at +0, e over the low (even-indexed) bfloat16 halves and o over the high (odd-indexed)
//       ones, e += a[m].bf16[2k] * b[k].bf16[2n] and o += a[m].bf16[2k+1] * b[k].bf16[2n+1] for
//       k = 0, 1, ... < a.colsb / 4 in turn, each a fused multiply-add with DAZ and FTZ; then
//       dst[m].fp32[n] += (e + o), two more additions with DAZ and FTZ; all rounded to nearest
//       even, MXCSR not consulted (kernels/bf16_scalar.h). (The intrinsics guide's older text adds
//       both products of each k to dst in turn; the self-test of a native table that relies on
//       this order checks it on the hardware: csrc/dispatch.cpp.)
// Palette 1: 8 tiles of at most 16 rows x 64 bytes, thread_local like the hardware's per-thread state.
// What the SDM makes invalid (#GP or #UD: a configuration breaking its rules, a tile used
// unconfigured, dot-product shapes that do not match, repeated tile operands), and what is not
// modelled (a nonzero start_row), stop the program (__builtin_trap, SIGILL, after a message on
// stderr), so that a kernel that would fault natively fails its tests here too.
//
// Everything has internal linkage (an anonymous namespace) except the tile state, one per thread
// for the whole build as on the hardware, where every AMX kernel file of a build (qgemm_amx.cpp,
// nbits_int8_amx.cpp) sees the configuration the others loaded: it is reached through
// qmm::QMM_KERNEL_NS::amx_emulation_state(), which the one file that defines
// QMM_AMX_EMULATION_STATE before including this header (qgemm_amx.cpp) defines. Include it after
// every other header: it replaces the AMX intrinsics of <immintrin.h> (included first, below) by macros.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // its AMX declarations, if any, before the macros below replace them
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "bf16_scalar.h"

namespace qmm_amx_emulation {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

// A trivial type (zero-initialized as a thread_local): no constructor for the files to share.
struct TileState {
  bool configured;
  uint8_t rows[kTiles];
  uint16_t colsb[kTiles];
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxColsb];  // 1 KB per tile
};

}  // namespace qmm_amx_emulation

namespace qmm::QMM_KERNEL_NS {
// This thread's tiles (the INIT state at first: all zero).
qmm_amx_emulation::TileState& amx_emulation_state();
#if defined(QMM_AMX_EMULATION_STATE)
qmm_amx_emulation::TileState& amx_emulation_state() {
  static thread_local qmm_amx_emulation::TileState state;
  return state;
}
#endif
}  // namespace qmm::QMM_KERNEL_NS

namespace qmm_amx_emulation {
namespace {

TileState& tiles() { return ::qmm::QMM_KERNEL_NS::amx_emulation_state(); }

[[noreturn]] void fault(const char* instruction, const char* what) {
  std::fprintf(stderr, "quantmatmul AMX emulation: %s: %s\n", instruction, what);
  std::fflush(stderr);
  __builtin_trap();
}

void clear_tiles() { std::memset(tiles().data, 0, sizeof(tiles().data)); }

void release() {
  TileState& state = tiles();
  state.configured = false;
  std::memset(state.rows, 0, sizeof(state.rows));
  std::memset(state.colsb, 0, sizeof(state.colsb));
  clear_tiles();
}

void loadconfig(const void* config) {
  const auto* b = static_cast<const uint8_t*>(config);
  if (b[0] == 0) return release();
  if (b[0] != 1) fault("LDTILECFG", "palette other than 0 or 1");
  if (b[1] != 0) fault("LDTILECFG", "start_row other than 0 (restarts are not emulated)");
  for (int i = 2; i < 16; ++i)
    if (b[i]) fault("LDTILECFG", "reserved bytes 2-15 not zero");
  for (int i = 32; i < 48; ++i)
    if (b[i]) fault("LDTILECFG", "reserved bytes 32-47 (tiles 8-15) not zero");
  for (int i = 56; i < 64; ++i)
    if (b[i]) fault("LDTILECFG", "reserved bytes 56-63 (tiles 8-15) not zero");
  uint8_t rows[kTiles];
  uint16_t colsb[kTiles];
  for (int t = 0; t < kTiles; ++t) {
    colsb[t] = static_cast<uint16_t>(b[16 + 2 * t] | (b[17 + 2 * t] << 8));
    rows[t] = b[48 + t];
    if (rows[t] > kMaxRows || colsb[t] > kMaxColsb) fault("LDTILECFG", "a tile larger than palette 1's 16 x 64 bytes");
    if ((rows[t] == 0) != (colsb[t] == 0)) fault("LDTILECFG", "a tile with rows or colsb zero, not both");
  }
  TileState& state = tiles();
  state.configured = true;
  std::memcpy(state.rows, rows, sizeof(rows));
  std::memcpy(state.colsb, colsb, sizeof(colsb));
  clear_tiles();
}

void storeconfig(void* config) {
  TileState& state = tiles();
  auto* b = static_cast<uint8_t*>(config);
  std::memset(b, 0, 64);  // the INIT state stores all zeros
  if (!state.configured) return;
  b[0] = 1;
  for (int t = 0; t < kTiles; ++t) {
    b[16 + 2 * t] = static_cast<uint8_t>(state.colsb[t] & 0xFF);
    b[17 + 2 * t] = static_cast<uint8_t>(state.colsb[t] >> 8);
    b[48 + t] = state.rows[t];
  }
}

void check_tile(int t, const char* instruction) {
  TileState& state = tiles();
  if (!state.configured) fault(instruction, "tiles not configured");
  if (t < 0 || t >= kTiles) fault(instruction, "tile number outside tmm0-tmm7");
}

void zero(int t) {
  TileState& state = tiles();
  check_tile(t, "TILEZERO");
  std::memset(state.data[t], 0, sizeof(state.data[t]));
}

void loadd(int t, const void* base, long long stride) {
  TileState& state = tiles();
  check_tile(t, "TILELOADD");
  const auto* src = static_cast<const uint8_t*>(base);
  std::memset(state.data[t], 0, sizeof(state.data[t]));
  for (int r = 0; r < state.rows[t]; ++r) std::memcpy(state.data[t][r], src + r * stride, state.colsb[t]);
}

void stored(int t, void* base, long long stride) {
  TileState& state = tiles();
  check_tile(t, "TILESTORED");
  auto* dst = static_cast<uint8_t*>(base);
  for (int r = 0; r < state.rows[t]; ++r) std::memcpy(dst + r * stride, state.data[t][r], state.colsb[t]);
}

// The operand checks of the dot-product instructions (#UD / #GP on the hardware).
void check_dot_shapes(int dst, int a, int b, const char* instruction) {
  TileState& state = tiles();
  check_tile(dst, instruction);
  check_tile(a, instruction);
  check_tile(b, instruction);
  if (dst == a || dst == b || a == b) fault(instruction, "tile operands not all different");
  if (state.colsb[a] % 4 != 0 || state.colsb[a] / 4 != state.rows[b]) fault(instruction, "a.colsb / 4 != b.rows");
  if (state.colsb[dst] != state.colsb[b]) fault(instruction, "dst.colsb != b.colsb");
  if (state.rows[dst] != state.rows[a]) fault(instruction, "dst.rows != a.rows");
}

// TDPB[S|U][S|U]D dst, a, b: ASigned / BSigned say how a's and b's bytes extend to 32 bits.
template <bool ASigned, bool BSigned>
void dot(int dst, int a, int b) {
  TileState& state = tiles();
  check_dot_shapes(dst, a, b, "TDPB*D");
  const int rows = state.rows[dst], kq = state.colsb[a] / 4, nd = state.colsb[dst] / 4;
  auto extend_a = [](uint8_t v) { return ASigned ? uint32_t(int32_t(int8_t(v))) : uint32_t(v); };
  auto extend_b = [](uint8_t v) { return BSigned ? uint32_t(int32_t(int8_t(v))) : uint32_t(v); };
  uint8_t (*d)[kMaxColsb] = state.data[dst];
  const uint8_t (*x)[kMaxColsb] = state.data[a];
  const uint8_t (*y)[kMaxColsb] = state.data[b];
  for (int m = 0; m < rows; ++m) {
    uint32_t tmp[kMaxColsb / 4];
    std::memcpy(tmp, d[m], sizeof(tmp));
    for (int k = 0; k < kq; ++k)
      for (int n = 0; n < nd; ++n) {
        uint32_t sum = tmp[n];  // uint32: wrapping, as the hardware's 32-bit adds
        for (int i = 0; i < 4; ++i) sum += extend_a(x[m][4 * k + i]) * extend_b(y[k][4 * n + i]);
        tmp[n] = sum;
      }
    std::memset(d[m], 0, kMaxColsb);  // write_row_and_zero: bytes past dst.colsb are zeroed
    std::memcpy(d[m], tmp, state.colsb[dst]);
  }
  for (int m = rows; m < kMaxRows; ++m) std::memset(d[m], 0, kMaxColsb);  // zero_upper_rows
}

// TDPBF16PS dst, a, b: a's and b's dwords as bfloat16 pairs, dst's as float32.
void dot_bf16(int dst, int a, int b) {
  using namespace qmm_bf16_scalar;
  TileState& state = tiles();
  check_dot_shapes(dst, a, b, "TDPBF16PS");
  const int rows = state.rows[dst], kp = state.colsb[a] / 4, nd = state.colsb[dst] / 4;
  uint8_t (*d)[kMaxColsb] = state.data[dst];
  for (int m = 0; m < rows; ++m) {
    uint32_t wa[kMaxColsb / 4];
    float tmp[kMaxColsb / 4], even[kMaxColsb / 4] = {}, odd[kMaxColsb / 4] = {};
    std::memcpy(wa, state.data[a][m], sizeof(wa));
    std::memcpy(tmp, d[m], sizeof(tmp));
    for (int k = 0; k < kp; ++k) {
      uint32_t wb[kMaxColsb / 4];
      std::memcpy(wb, state.data[b][k], sizeof(wb));
      for (int n = 0; n < nd; ++n) {
        even[n] = fma_daz_ftz(low_half(wa[k]), low_half(wb[n]), even[n]);
        odd[n] = fma_daz_ftz(high_half(wa[k]), high_half(wb[n]), odd[n]);
      }
    }
    for (int n = 0; n < nd; ++n) tmp[n] = add_daz_ftz(tmp[n], add_daz_ftz(even[n], odd[n]));
    std::memset(d[m], 0, kMaxColsb);  // write_row_and_zero
    std::memcpy(d[m], tmp, state.colsb[dst]);
  }
  for (int m = rows; m < kMaxRows; ++m) std::memset(d[m], 0, kMaxColsb);  // zero_upper_rows
}

}  // namespace
}  // namespace qmm_amx_emulation

#undef _tile_loadconfig
#undef _tile_storeconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_dpbssd
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_dpbuud
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) ::qmm_amx_emulation::loadconfig(config)
#define _tile_storeconfig(config) ::qmm_amx_emulation::storeconfig(config)
#define _tile_release() ::qmm_amx_emulation::release()
#define _tile_zero(t) ::qmm_amx_emulation::zero(t)
#define _tile_loadd(t, base, stride) ::qmm_amx_emulation::loadd(t, base, static_cast<long long>(stride))
#define _tile_stream_loadd(t, base, stride) ::qmm_amx_emulation::loadd(t, base, static_cast<long long>(stride))
#define _tile_stored(t, base, stride) ::qmm_amx_emulation::stored(t, base, static_cast<long long>(stride))
#define _tile_dpbssd(dst, a, b) ::qmm_amx_emulation::dot<true, true>(dst, a, b)
#define _tile_dpbsud(dst, a, b) ::qmm_amx_emulation::dot<true, false>(dst, a, b)
#define _tile_dpbusd(dst, a, b) ::qmm_amx_emulation::dot<false, true>(dst, a, b)
#define _tile_dpbuud(dst, a, b) ::qmm_amx_emulation::dot<false, false>(dst, a, b)
#define _tile_dpbf16ps(dst, a, b) ::qmm_amx_emulation::dot_bf16(dst, a, b)
