// amx_config.h: the AMX tile configuration (LDTILECFG's 64 bytes, palette 1) and loading it on a thread whose configuration differs, for the AMX kernel files.
//
// Included by qgemm_amx.cpp, nbits_int8_amx.cpp and float8_amx.cpp after <immintrin.h> or, in the emulated build,
// after amx_emulation.h, whose macros replace the intrinsics used here. Internal linkage only.
#pragma once

#include <cstdint>
#include <cstring>

namespace qmm {
namespace {

// LDTILECFG's 64 bytes: byte 0 palette, 1 start_row, 16 + 2t tile t's bytes per row, 48 + t its rows.
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

// Loads `config` unless it is the thread's configuration already. Called at the start of each task,
// not once per thread: other AMX code on the same thread (ONNX Runtime's, in the same process, or
// the other AMX family's entry) may have loaded its own since. `config` must be constant-initialized
// (constexpr, in read-only memory): GCC's _tile_loadconfig tells the compiler it reads 8 bytes
// only, so a configuration built by stores could have the rest dropped.
inline void configure_tiles(const TileConfig& config) {
  alignas(64) unsigned char current[64];
  _tile_storeconfig(current);
  // GCC's _tile_storeconfig declares 8 bytes written: make all 64 opaque to the compiler.
  __asm__ volatile("" : : "r"(current) : "memory");
  if (std::memcmp(current, &config, sizeof(config)) != 0) _tile_loadconfig(&config);
}

}  // namespace
}  // namespace qmm
