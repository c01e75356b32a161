// nbits_bf16_avx512.h: the avx512bf16 MatMulNBits entry (level 3 prefill on vdpbf16ps; the rest from the avx512_vnni build), registered by float8_avx512bf16.cpp's build.
//
// Defined in nbits_bf16_avx512.cpp, in the namespace of the build that compiles it (avx512bf16
// natively, avx512bf16_emulated over SIMDe and kernels/bf16_emulation.h).
#pragma once

#include "dispatch.h"

namespace qmm::avx512bf16 {
extern const NBitsDispatch kNBitsEntry;
}  // namespace qmm::avx512bf16

namespace qmm::avx512bf16_emulated {
extern const NBitsDispatch kNBitsEntry;
}  // namespace qmm::avx512bf16_emulated
