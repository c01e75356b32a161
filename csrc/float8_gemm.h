// float8_gemm.h: the float32 GEMM of QLinearMatMul's float8 path: b in 16-column panels (packed once for a constant b), the active float8 entry's tasks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "buffer.h"
#include "dispatch.h"

namespace qmm {

// Distinct [K, N] float32 matrices b packed for the float8 path (csrc/kernels/sgemm_rows.inc):
// panels[i] holds matrix i as ceil(N / 16) panels of [K][16], zero padded past column N. When the
// entry active at packing time has a pair table and every value is pair-exact (csrc/qgemm.h), the
// same panels in bfloat16 pairs too ([ceil(N / 16)][ceil(K / 2)][16] words per matrix), so a
// constant weight is neither packed nor checked again per call.
struct PackedF32 {
  int64_t count = 0, K = 0, N = 0;
  const Float8Dispatch* entry = nullptr;  // the entry active when packed
  Buffer<float> panels;
  Buffer<uint32_t> pairs;  // null: the entry has no pair table, or a value is not pair-exact

  int64_t panel_count() const { return (N + 15) / 16; }
  const float* matrix(int64_t i) const { return panels.get() + i * panel_count() * 16 * K; }
  const uint32_t* pair_matrix(int64_t i) const { return pairs.get() + i * panel_count() * 16 * ((K + 1) / 2); }
  size_t bytes() const;
};

// b: count contiguous row-major [K, N] float32 matrices. Packs on the thread pool.
PackedF32 pack_f32(const float* b, int64_t count, int64_t K, int64_t N);

// out[i] = a[a_index[i]] @ b[b_index[i]] in float32, a [Ba, M, K] contiguous, out [batch, M, N]: in
// the active entry's documented order (docs/quantization.md): one fused multiply-add per k in
// order k = 0 .. K-1 from +0 (every sgemm table), or the entry's pair order when it has a pair
// table and every value of a and b is pair-exact. Bit for bit reproducible, whatever the threads.
void matmul_f32_sequential(int64_t batch, int64_t M, int64_t K, const float* a, const int64_t* a_index,
                           const PackedF32& b, const int64_t* b_index, float* out);
// The same with a as 8-bit codes [Ba, M, K] whose float32 values table[256] holds (the float8
// operand): on a pair table the codes become pair words directly (no float32 copy of a; the same
// words, so the same bits); where the pair table does not run, values() gives a's float32 values
// ([Ba, M, K], the caller's lookup) for the FMA table.
void matmul_f32_codes(int64_t batch, int64_t M, int64_t K, const uint8_t* a, const float* table,
                      const std::function<const float*()>& values, const int64_t* a_index, const PackedF32& b,
                      const int64_t* b_index, float* out);

}  // namespace qmm
