// nbits_bf16_amx.h: what the amxbf16 build's two files share: the tdpbf16ps pair table (float8_amx.cpp) and the MatMulNBits entry (nbits_bf16_amx.cpp).
//
// Declared for the native (amxbf16) and the emulated (amxbf16_emulated) build's namespace; each
// build defines one set.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace qmm::amxbf16 {
// PairRows (csrc/qgemm.h) with pair group 1, in the order "tiles of 32 k" (float8_amx.cpp).
void pair_rows_amx(const uint32_t* a, const uint32_t* b_panels, float* y, int64_t ldy, int64_t rows, int64_t cols,
                   int64_t K);
// Level 3 prefill on pair_rows_amx; every other path the amx entry's.
extern const NBitsDispatch kNBitsEntry;
}  // namespace qmm::amxbf16

namespace qmm::amxbf16_emulated {
void pair_rows_amx(const uint32_t* a, const uint32_t* b_panels, float* y, int64_t ldy, int64_t rows, int64_t cols,
                   int64_t K);
extern const NBitsDispatch kNBitsEntry;
}  // namespace qmm::amxbf16_emulated
