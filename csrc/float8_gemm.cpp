// float8_gemm.cpp: the float8 path's float32 GEMM driver: b packed in panels (once for a constant weight), a per call, tasks on the thread pool.
#include "float8_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "qgemm.h"
#include "thread_pool.h"

namespace qmm {

namespace {

constexpr int64_t kPanel = 16;  // columns per panel

// Matrix i's panels [p0, p1), rows [k0, k1) of each: row k of the source is read once, left to
// right, and spread over the panels (a few output streams), instead of panel by panel down the
// columns (one page per row: at N = 4096 that walk was TLB-bound, 90 ms for 64 MB).
void pack_panels(const float* b, int64_t K, int64_t N, int64_t p0, int64_t p1, int64_t k0, int64_t k1, float* panels) {
  for (int64_t k = k0; k < k1; ++k) {
    const float* row = b + k * N;
    for (int64_t p = p0; p < p1; ++p) {
      float* dst = panels + (p * K + k) * kPanel;
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
      if (cols == kPanel) {
        std::memcpy(dst, row + n0, sizeof(float) * kPanel);
        continue;
      }
      int64_t j = 0;
      for (; j < cols; ++j) dst[j] = row[n0 + j];
      for (; j < kPanel; ++j) dst[j] = 0.0f;
    }
  }
}

// The float8 path's tasks: (matrix, block of columns, block of rows), rows fastest: the row blocks
// of one column block run side by side and share its b panels through the last-level cache. A
// task takes 48 rows (a multiple of every entry's a_group) and about kTaskPanelBytes of b panels
// (L2-sized; an even count of at least 2: the AVX-512 tiles take panels in pairs): M = 128,
// N = K = 4096 makes 3 x 128 tasks with float32 panels. Each output is still computed by one task,
// one chain of additions over all of k. rows_fn(a_rows, b_panels, y, ldy, rows, cols) computes one
// task: a_rows the first of its rows in the packed a (a_row elements per row), b_panels its first
// panel (panel_elems elements per panel).
template <class T, class RowsFn>
void float8_tasks(int64_t batch, int64_t M, int64_t N, int64_t group, const T* a, int64_t a_row, const int64_t* a_index,
                  const T* b, int64_t panel_elems, const int64_t* b_index, float* out, RowsFn&& rows_fn) {
  constexpr int64_t kRowsPerTask = 48;
  constexpr int64_t kTaskPanelBytes = 512 << 10;
  const int64_t panels = (N + 15) / 16, b_elems = panels * panel_elems;
  const int64_t task_rows = (kRowsPerTask + group - 1) / group * group;
  const int64_t panel_bytes = panel_elems * static_cast<int64_t>(sizeof(T));
  const int64_t task_panels = std::max<int64_t>(2, (panel_bytes ? kTaskPanelBytes / panel_bytes : panels) / 2 * 2);
  const int64_t row_blocks = (M + task_rows - 1) / task_rows, col_blocks = (panels + task_panels - 1) / task_panels;
  parallel_for(batch * col_blocks * row_blocks, [&](int64_t task) {
    const int64_t bt = task / (col_blocks * row_blocks), block = task % (col_blocks * row_blocks);
    const int64_t m0 = block % row_blocks * task_rows, p0 = block / row_blocks * task_panels, n0 = p0 * 16;
    rows_fn(a + (a_index[bt] * M + m0) * a_row, b + b_index[bt] * b_elems + p0 * panel_elems,
            out + (bt * M + m0) * N + n0, N, std::min(task_rows, M - m0), std::min(task_panels * 16, N - n0));
  });
}

int64_t distinct(const int64_t* index, int64_t batch) {
  return batch ? *std::max_element(index, index + batch) + 1 : 0;
}

// b's panels as bfloat16 pairs (pack_pair_panel reads a [K][16] panel as a 16-column matrix);
// null when a value is not pair-exact (the tasks after the first one that sees it return at once).
Buffer<uint32_t> pair_panels(const PackedF32& b) {
  const int64_t panels = b.count * b.panel_count(), words = (b.K + 1) / 2 * kPanel;
  Buffer<uint32_t> pairs = alloc_buffer<uint32_t>(static_cast<size_t>(panels * words));
  std::atomic<bool> exact{true};
  parallel_for(panels, [&](int64_t p) {
    if (!exact.load(std::memory_order_relaxed)) return;
    if (!pack_pair_panel(b.panels.get() + p * b.K * kPanel, b.K, kPanel, 0, pairs.get() + p * words))
      exact.store(false, std::memory_order_relaxed);
  });
  if (!exact.load()) pairs.reset();
  return pairs;
}

// The product over the entry's pair table with b's pair panels, when every value of a is
// pair-exact too; false, computing nothing, otherwise. a packed once per call: pack_group(m0,
// rows, words) packs rows [m0, m0 + rows) of a (its matrices one after another) as pack_pair_group
// does, and says whether they were pair-exact.
template <class PackGroup>
bool matmul_pairs(const Float8Dispatch& entry, int64_t batch, int64_t M, int64_t N, int64_t K, const int64_t* a_index,
                  const uint32_t* b_pairs, const int64_t* b_index, float* out, PackGroup&& pack_group) {
  const int64_t KP = (K + 1) / 2, group = pair_group(entry);
  const int64_t a_count = distinct(a_index, batch), groups = (M + group - 1) / group;
  std::atomic<bool> exact{true};
  const Buffer<uint32_t> a_pairs = alloc_buffer<uint32_t>(static_cast<size_t>(a_count * M * KP));
  parallel_for(a_count * groups, [&](int64_t task) {
    if (!exact.load(std::memory_order_relaxed)) return;
    const int64_t m0 = task / groups * M + task % groups * group, rows = std::min(group, M - task % groups * group);
    if (!pack_group(m0, rows, a_pairs.get() + m0 * KP)) exact.store(false, std::memory_order_relaxed);
  });
  if (!exact.load()) return false;
  const PairRows pair_rows = entry.pair_rows;
  float8_tasks(batch, M, N, group, a_pairs.get(), KP, a_index, b_pairs, KP * 16, b_index, out,
               [&](const uint32_t* ar, const uint32_t* bp, float* y, int64_t ldy, int64_t rows, int64_t cols) {
                 pair_rows(ar, bp, y, ldy, rows, cols, K);
               });
  return true;
}

}  // namespace

size_t PackedF32::bytes() const {
  const int64_t words = count * panel_count() * kPanel;
  return static_cast<size_t>(words * K) * sizeof(float) + (pairs ? static_cast<size_t>(words * ((K + 1) / 2)) * 4 : 0);
}

PackedF32 pack_f32(const float* b, int64_t count, int64_t K, int64_t N) {
  PackedF32 packed;
  packed.count = count;
  packed.K = K;
  packed.N = N;
  packed.entry = &float8_kernels();
  const int64_t panels = packed.panel_count(), matrix_floats = panels * kPanel * K;
  // Every element is written by the tasks (padding too): no serial zeroing of a large buffer.
  packed.panels = alloc_buffer<float>(static_cast<size_t>(count * matrix_floats));
  constexpr int64_t kPanelsPerTask = 64, kRowsPerTask = 32;
  const int64_t panel_groups = (panels + kPanelsPerTask - 1) / kPanelsPerTask,
                row_groups = (K + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(count * panel_groups * row_groups, [&](int64_t task) {
    const int64_t i = task / (panel_groups * row_groups), rest = task % (panel_groups * row_groups);
    const int64_t p0 = rest / row_groups * kPanelsPerTask, k0 = rest % row_groups * kRowsPerTask;
    pack_panels(b + i * K * N, K, N, p0, std::min(panels, p0 + kPanelsPerTask), k0, std::min(K, k0 + kRowsPerTask),
                packed.panels.get() + i * matrix_floats);
  });
  if (packed.entry->pair_rows && K > 0) packed.pairs = pair_panels(packed);
  return packed;
}

namespace {

// The pair table where the entry has one and the values allow it (docs/quantization.md): true when
// it ran. b's pairs come from its packing when it was packed for this entry, else from its panels
// now. K = 0 (every output +0 either way) takes the float32 FMA table.
template <class PackGroup>
bool try_pairs(const Float8Dispatch& entry, int64_t batch, int64_t M, int64_t K, const int64_t* a_index,
               const PackedF32& b, const int64_t* b_index, float* out, PackGroup&& pack_group) {
  if (!entry.pair_rows || batch <= 0 || M <= 0 || b.N <= 0 || K <= 0 || K >= (int64_t{1} << 29)) return false;
  Buffer<uint32_t> own;
  const uint32_t* b_pairs = b.pairs.get();
  if (b.entry != &entry) b_pairs = (own = pair_panels(b)).get();
  return b_pairs && matmul_pairs(entry, batch, M, b.N, K, a_index, b_pairs, b_index, out, pack_group);
}

// The float32 FMA table (SgemmRows) over a's float32 values.
void matmul_fma(const Float8Dispatch& entry, int64_t batch, int64_t M, int64_t K, const float* a,
                const int64_t* a_index, const PackedF32& b, const int64_t* b_index, float* out) {
  const int64_t N = b.N;
  const SgemmRows sgemm_rows = entry.sgemm_rows;
  const int64_t group = entry.a_group;
  // Each distinct a, its rows interleaved by k in groups of the entry's a_group (csrc/qgemm.h):
  // once per call, so that no task copies rows again for each of its column blocks.
  const float* a_rows = a;
  Buffer<float> a_packed;
  if (group > 1) {
    const int64_t a_count = distinct(a_index, batch), groups = (M + group - 1) / group;
    a_packed = alloc_buffer<float>(static_cast<size_t>(a_count * M * K));
    parallel_for(a_count * groups, [&](int64_t task) {
      const int64_t m0 = task / groups * M + task % groups * group, rows = std::min(group, M - task % groups * group);
      const float* src = a + m0 * K;
      float* dst = a_packed.get() + m0 * K;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < rows; ++r) dst[k * rows + r] = src[r * K + k];
    });
    a_rows = a_packed.get();
  }
  float8_tasks(batch, M, N, group, a_rows, K, a_index, b.panels.get(), kPanel * K, b_index, out,
               [&](const float* ar, const float* bp, float* y, int64_t ldy, int64_t rows, int64_t cols) {
                 sgemm_rows(ar, bp, y, ldy, rows, cols, K);
               });
}

}  // namespace

void matmul_f32_sequential(int64_t batch, int64_t M, int64_t K, const float* a, const int64_t* a_index,
                           const PackedF32& b, const int64_t* b_index, float* out) {
  const Float8Dispatch& entry = float8_kernels();
  if (try_pairs(entry, batch, M, K, a_index, b, b_index, out,
                [&](int64_t m0, int64_t rows, uint32_t* words) { return pack_pair_group(a + m0 * K, rows, K, words); }))
    return;
  matmul_fma(entry, batch, M, K, a, a_index, b, b_index, out);
}

void matmul_f32_codes(int64_t batch, int64_t M, int64_t K, const uint8_t* a, const float* table,
                      const std::function<const float*()>& values, const int64_t* a_index, const PackedF32& b,
                      const int64_t* b_index, float* out) {
  const Float8Dispatch& entry = float8_kernels();
  if (entry.pair_rows) {
    const PairCodes codes = codes_for_pairs(table);
    if (try_pairs(entry, batch, M, K, a_index, b, b_index, out, [&](int64_t m0, int64_t rows, uint32_t* words) {
          return pack_pair_group_codes(a + m0 * K, rows, K, codes, words);
        }))
      return;
  }
  matmul_fma(entry, batch, M, K, values(), a_index, b, b_index, out);
}

}  // namespace qmm
