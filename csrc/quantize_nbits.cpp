// quantize_nbits.cpp: quantize_nbits' driver: panels of blocks over the thread pool, the choice of block-loop build, ORT's padding and the packed zero points.
#include "quantize_nbits.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "cpu_features.h"
#include "dispatch.h"
#include "thread_pool.h"

// The baseline build of the block loops.
#define QMM_QUANTIZE_NS portable
#include "quantize_nbits_blocks.inc"
#undef QMM_QUANTIZE_NS

namespace qmm {

#if QMM_QUANTIZE_AVX2
namespace avx2 {  // kernels/quantize_nbits_avx2.cpp
QuantizeStatus quantize_panel(const QuantizeNBitsProblem& p, const QuantizeNBitsOutput& out, uint8_t* zp_codes,
                              int64_t kb, int64_t n0, int64_t n1, float* scratch);
}
#endif

namespace {

using PanelFn = QuantizeStatus (*)(const QuantizeNBitsProblem&, const QuantizeNBitsOutput&, uint8_t*, int64_t, int64_t,
                                   int64_t, float*);

PanelFn panel_function() {
#if QMM_QUANTIZE_AVX2
  if (avx2_loops_usable()) return avx2::quantize_panel;
#endif
  return portable::quantize_panel;
}

bool ort_width(int bits) { return bits == 2 || bits == 4 || bits == 8; }

// ONNX Runtime's quantizer packs 8/bits codes per byte from a scratch it reuses within a thread
// block (block_size * 8/bits rows of a column): in the byte that straddles K, the slots past K keep
// the codes of the previous byte, unless that byte starts a thread block (docs/quantizer.md). The
// panels wrote zeros there.
void ort_tail_padding(const QuantizeNBitsProblem& p, const QuantizeNBitsOutput& out, int64_t k_blocks) {
  if (!ort_width(p.bits)) return;
  const int64_t per_byte = 8 / p.bits, tail = p.K % per_byte, start = p.K - tail;
  if (tail == 0 || start % (p.block_size * per_byte) == 0) return;
  const int64_t row_bytes = k_blocks * p.block_size * p.bits / 8, at = start / per_byte;
  const auto low = static_cast<uint8_t>((1u << (tail * p.bits)) - 1u);
  for (int64_t n = 0; n < p.N; ++n) {
    uint8_t* row = out.B + n * row_bytes;
    row[at] = static_cast<uint8_t>((row[at] & low) | (row[at - 1] & ~low));
  }
}

// Zero-point codes [N, k_blocks] packed per row like B; the unused slots of a row's last byte hold
// 2^(bits-1) for ORT's widths (its scratch starts there), 0 for the others.
void pack_zero_points(const QuantizeNBitsProblem& p, const uint8_t* codes, int64_t k_blocks, uint8_t* out) {
  const int bits = p.bits;
  const int64_t row_bytes = (k_blocks * bits + 7) / 8;
  const int64_t slots = ort_width(bits) ? row_bytes * 8 / bits : k_blocks;
  const uint32_t mid = 1u << (bits - 1);
  for (int64_t n = 0; n < p.N; ++n) {
    uint8_t* row = out + n * row_bytes;
    std::memset(row, 0, static_cast<size_t>(row_bytes));
    for (int64_t i = 0; i < slots; ++i) {
      const uint32_t v = i < k_blocks ? codes[n * k_blocks + i] : mid;
      const int64_t bit = i * bits;
      const uint32_t shifted = v << (bit % 8);
      row[bit / 8] |= static_cast<uint8_t>(shifted);
      if ((bit % 8) + bits > 8) row[bit / 8 + 1] |= static_cast<uint8_t>(shifted >> 8);
    }
  }
}

}  // namespace

QuantizeStatus quantize_nbits(const QuantizeNBitsProblem& p, const QuantizeNBitsOutput& out) {
  const int64_t bs = p.block_size, k_blocks = (p.K + bs - 1) / bs;
  const bool integer_zero_points = !p.symmetric && p.method != QuantizeMethod::kHqq;
  std::vector<uint8_t> zp_codes(integer_zero_points ? static_cast<size_t>(p.N * k_blocks) : 0);
  // panels of about 8K elements: whole cache lines of W's rows, a buffer that stays in L1/L2
  const int64_t columns = std::min<int64_t>(p.N, std::clamp<int64_t>(8192 / bs, 8, 256));
  const int64_t column_tasks = (p.N + columns - 1) / columns;
  const PanelFn panel = panel_function();
  std::atomic<int> status{static_cast<int>(QuantizeStatus::kOk)};
  parallel_for(k_blocks * column_tasks, [&](int64_t task) {
    if (status.load(std::memory_order_relaxed) != 0) return;
    const int64_t kb = task / column_tasks, n0 = (task % column_tasks) * columns;
    const int64_t n1 = std::min(p.N, n0 + columns);
    thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>((n1 - n0) * (bs + 2) + 25 * bs);
    if (scratch.size() < need) scratch.resize(need);
    const QuantizeStatus s = panel(p, out, zp_codes.data(), kb, n0, n1, scratch.data());
    if (s != QuantizeStatus::kOk) status.store(static_cast<int>(s));
  });
  if (status.load() != 0) return static_cast<QuantizeStatus>(status.load());
  ort_tail_padding(p, out, k_blocks);
  if (integer_zero_points) pack_zero_points(p, zp_codes.data(), k_blocks, static_cast<uint8_t*>(out.zero_points));
  return QuantizeStatus::kOk;
}

const char* quantize_nbits_path() { return avx2_loops_usable() ? "avx2" : "portable"; }

uint16_t float_to_half_bits(float x) { return portable::half_bits(x); }
uint16_t float_to_bfloat16_bits(float x) { return portable::bfloat16_bits(x); }

}  // namespace qmm
