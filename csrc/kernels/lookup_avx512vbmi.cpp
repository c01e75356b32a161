// lookup_avx512vbmi.cpp: a 256-entry table of bytes applied to uint8 codes 64 at a time (vpermi2b), the ONNX session's element-wise groups (onnx/_tables.py).
//
// vpermi2b picks each output byte from two registers (128 bytes) by the low 7 bits of its index: one
// pick from entries 0-127, one from 128-255, and bit 7 of the code chooses (vpmovb2m, a blend). Five
// instructions for 64 codes, where the scalar loop loads a code and an entry for each. Built in the
// avx512vbmi build (natively and over SIMDe, QMM_EMULATED, for the tests); onnx_ops.cpp picks it.
#include "avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "dispatch.h"

namespace qmm {
namespace QMM_KERNEL_NS {

namespace {
struct ByteTable {
  __m512i entries[4];  // 0-63, 64-127, 128-191, 192-255

  explicit ByteTable(const uint8_t* table) {
    for (int q = 0; q < 4; ++q) entries[q] = _mm512_loadu_si512(table + 64 * q);
  }
  __m512i operator()(__m512i codes) const {
    const __m512i low = _mm512_permutex2var_epi8(entries[0], codes, entries[1]);
    const __m512i high = _mm512_permutex2var_epi8(entries[2], codes, entries[3]);
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(codes), low, high);
  }
};
}  // namespace

// out[i] = table[codes[i]] for i < count; out may be codes itself.
void lookup_bytes(const uint8_t* codes, int64_t count, const uint8_t* table, uint8_t* out) {
  const ByteTable lookup(table);
  int64_t i = 0;
  for (; i + 64 <= count; i += 64) _mm512_storeu_si512(out + i, lookup(_mm512_loadu_si512(codes + i)));
  if (i <
      count) {  // the tail through a buffer (SIMDe has no masked byte loads, and its masked stores write every lane)
    alignas(64) uint8_t buffer[64] = {};
    const auto n = static_cast<size_t>(count - i);
    std::memcpy(buffer, codes + i, n);
    _mm512_store_si512(buffer, lookup(_mm512_load_si512(buffer)));
    std::memcpy(out + i, buffer, n);
  }
}

}  // namespace QMM_KERNEL_NS

// No kernel table entries: onnx_ops.cpp calls lookup_bytes by name.
KernelEntries QMM_KERNELS_FN() { return {nullptr, nullptr, nullptr}; }

}  // namespace qmm
