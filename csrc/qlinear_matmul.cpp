// qlinear_matmul.cpp: the QLinearMatMul driver: packed-kernel tasks on the thread pool, exact accumulators, fused epilogues.
#include "qlinear_matmul.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "buffer.h"
#include "dispatch.h"
#include "onnx_ops.h"
#include "qgemm.h"
#include "requantize.h"
#include "thread_pool.h"

namespace qmm {

const int8_t* PackedB::matrix(int64_t i) const { return data.get() + i * layout->packed_b_bytes(K, N); }

size_t PackedB::bytes() const {
  return static_cast<size_t>(count * layout->packed_b_bytes(K, N)) + colsum.size() * sizeof(int32_t);
}

PackedB pack_b_matrices(const void* b, bool is_signed, int64_t count, int64_t K, int64_t N, bool for_receptive_fields) {
  const QGemmDispatch& q = for_receptive_fields ? qgemm_taps_kernels() : qgemm_kernels();
  const QGemmLayout& L = *q.layout;
  PackedB packed;
  packed.count = count;
  packed.K = K;
  packed.N = N;
  packed.is_signed = is_signed;
  packed.layout = &L;
  packed.entry = &q;
  const size_t bytes = static_cast<size_t>(count * L.packed_b_bytes(K, N));
  packed.data = alloc_buffer<int8_t>(bytes + 64);  // std::bad_alloc: nanobind's MemoryError
  packed.colsum.resize(static_cast<size_t>(count * N));
  constexpr int64_t kPanelsPerTask = 16;
  const int64_t panels = L.n_panels(N), groups = (panels + kPanelsPerTask - 1) / kPanelsPerTask;
  parallel_for(count * groups, [&](int64_t task) {
    const int64_t i = task / groups, panel0 = task % groups * kPanelsPerTask;
    q.pack_b_panels(
        static_cast<const uint8_t*>(b) + i * K * N, is_signed, K, N, panel0, std::min(panels, panel0 + kPanelsPerTask),
        packed.data.get() + i * L.packed_b_bytes(K, N) + panel0 * L.panel_bytes(K), packed.colsum.data() + i * N);
  });
  return packed;
}

namespace {
QGemmBlocking blocking_override;  // zeros: the defaults
}  // namespace

void set_qgemm_blocking(const QGemmBlocking& blocking) { blocking_override = blocking; }

QGemmBlocking qgemm_blocking(const QGemmLayout& L) {
  const QGemmBlocking& set = blocking_override;
  QGemmBlocking b;
  b.task_rows = set.task_rows > 0 ? (set.task_rows + L.mr - 1) / L.mr * L.mr : L.task_rows;
  b.task_panel_bytes = set.task_panel_bytes > 0 ? set.task_panel_bytes : L.task_panel_bytes;
  b.k_block = set.k_block > 0 ? (set.k_block + L.kc - 1) / L.kc * L.kc : L.k_block;
  b.tasks_per_thread = set.tasks_per_thread > 0 ? set.tasks_per_thread : 16;
  return b;
}

namespace {

// Whether a column's zb' = zb + ob is not 0 for some b matrix of the problem, whose b zero points are
// b_zero_points elements (the row sums of a are then multiplied by it; an int8 b with zero point 0,
// the usual weight, needs none).
bool needs_row_sums(const QGemmProblem& p, int64_t b_zero_points, int32_t ob) {
  return std::any_of(p.b_zero_point, p.b_zero_point + b_zero_points, [&](int32_t z) { return z + ob != 0; });
}

// The elements from one matrix's zero points to the next's (QGemmProblem's a/b_zero_point_ld): rows
// where negative, else as given.
int64_t zero_point_ld(int64_t ld, int64_t rows) { return ld < 0 ? rows : ld; }

// How many zero points the problem's b matrices have (N where they share one matrix's).
int64_t b_zero_points(const QGemmProblem& p) {
  const int64_t b_count = *std::max_element(p.b_index, p.b_index + p.batch) + 1;
  return (b_count - 1) * zero_point_ld(p.b_zero_point_ld, p.N) + p.N;
}

// Whether every zero point lies in its 8-bit operand's range (a small product's differences then fit int16).
bool zero_points_in_range(const int32_t* zp, int64_t count, bool is_signed) {
  int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
  for (int64_t i = 0; i < count; ++i) {  // (no early exit: a vectorized min / max)
    lo = std::min(lo, zp[i]);
    hi = std::max(hi, zp[i]);
  }
  return lo == (is_signed ? -128 : 0) && hi == (is_signed ? 127 : 255);
}

// Small products (K and N within the small-product kernels' limits, b per call) go in blocks of rows
// of about this many multiply-adds: each block prepares its b again (about a tenth of its work at
// K = 128, N = 64; at 2^18 a third, 1024 x 128 x 64 then 1.1x slower than packed), the blocks spread
// over the threads.
constexpr int64_t kSmallProductBlockWork = int64_t{1} << 20;

// The bytes of a (batch x M x K) up to which a constant b's column blocks narrow before its rows
// split into runs (accumulate), and the column blocks per thread that are then enough.
constexpr int64_t kColumnSplitA = int64_t{1} << 19;
constexpr int64_t kMinTasksPerThread = 4;

}  // namespace

bool taps_usable(const QGemmDispatch& q, bool a_signed, bool need_rowsums, int64_t batch, int64_t K, int64_t taps) {
  const QGemmLayout& L = *q.layout;
  return q.kernel_taps && L.id == kLayoutQuads && L.a_offset[a_signed] == 0 && !need_rowsums && batch == 1 &&
         taps > 0 && K > 0 && K % (L.kc * taps) == 0;
}

namespace {

constexpr int64_t kKPerChunk = 1 << 15;  // 2^15 products of at most 255^2 < 2^16: int32 cannot overflow

// The zero-point terms of one output row (RowTerms, csrc/qgemm.h) for exact int64 sums.
struct RowTerms64 {
  const int64_t* zb;
  const int64_t* colsum;
  int64_t za, t;
};
// The sum of a row of K 8-bit values (int8 when is_signed, else uint8).
int64_t row_sum(const uint8_t* row, int64_t K, bool is_signed) {
  int64_t k = 0, sum = 0;
#if defined(__SSE2__)
  // psadbw adds 8 bytes into a 64-bit lane; int8 values are summed as uint8 (x ^ 0x80 = x + 128) less 128 each.
  const __m128i flip = _mm_set1_epi8(is_signed ? static_cast<char>(0x80) : 0), zero = _mm_setzero_si128();
  __m128i sums = zero;
  for (; k + 16 <= K; k += 16) {
    const __m128i v = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)), flip);
    sums = _mm_add_epi64(sums, _mm_sad_epu8(v, zero));
  }
  alignas(16) int64_t lanes[2];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), sums);
  sum = lanes[0] + lanes[1] - (is_signed ? 128 * k : 0);
#endif
  for (; k < K; ++k) sum += is_signed ? int64_t{static_cast<int8_t>(row[k])} : int64_t{row[k]};
  return sum;
}

template <class Acc>
using TermsOf = std::conditional_t<std::is_same_v<Acc, int64_t>, RowTerms64, RowTerms>;

// A task's buffers, one set per thread, fetched once per task (not once per vector and block).
template <class Acc>
struct TaskScratch {
  std::vector<int32_t> c32;
  std::vector<int64_t> c64, rowsums;
  std::vector<Acc> zb_stored, colsum_stored;
  std::vector<TermsOf<Acc>> row_terms;
  std::vector<int8_t> b_block;  // b's panels, packed per call
  std::vector<int32_t> b_colsum;
  // Whether zb_stored / colsum_stored hold the column terms of the task's column block for a block
  // whose rows share za' = columns_za (uniform) or not (they depend on nothing else within a task).
  bool columns_ready = false, columns_uniform = false;
  int64_t columns_za = 0;
};
inline int32_t terms_applied(const int32_t* raw, const RowTerms& terms, int64_t j) {
  return row_terms_applied(raw, terms, j);
}
inline int64_t terms_applied(const int64_t* raw, const RowTerms64& terms, int64_t j) {
  return raw[j] - (terms.zb ? terms.zb[j] * terms.t : terms.t) - terms.za * terms.colsum[j];
}

// The entry a call runs on, read once: the one in use, unless b was packed in a layout it does not
// read (another thread's set_isa between the caller's check of the layout and this call), then the
// entry that packed b. Every int8 entry gives the same bits, so either is the call's result.
const QGemmDispatch& call_entry(const QGemmProblem& p) {
  const QGemmDispatch& now = qgemm_kernels();
  if (!p.b_packed || p.b_packed->layout == now.layout) return now;
  if (!p.b_packed->entry)
    throw std::runtime_error(std::string("b was packed in the layout \"") + p.b_packed->layout->name +
                             "\", but the int8 kernels in use (" + now.info.name + ") read \"" + now.layout->name +
                             "\": pack it again");
  return *p.b_packed->entry;
}

// Calls epilogue(batch, m0, rows, n0, cols, raw, ld, terms) for each block of rows m0 .. m0+rows-1,
// where for its row r terms_applied(raw + r * ld, terms[r], j) = sum_k (a[m0+r,k] - a_zp[m0+r]) *
// (b[k,n0+j] - b_zp[n0+j]) (one call per block: the epilogue's setup is paid per block, not per row):
// exact (int64_t) when Acc is int64_t, modulo 2^32 (int32_t, as a wrapping int32 accumulation
// gives: numerics "onnxruntime" and "onnx-reference") when Acc is int32_t.
//
// Work is split into tasks run on the thread pool: for a constant b (matrix, block of columns, run
// of row blocks), else (matrix, block of columns) over all rows. For each row block, k goes in
// blocks of the layout's k_block, each swept over every panel and row group, the kernels adding
// into C: a block of A stays in cache across the panels, one of B across the row groups and blocks.
// The zero points come out of the inner loop (docs/quantization.md, "Zero-point terms"). With the
// layout's stored values a' = a + oa, b' = b + ob and the shifted zero points za' = za + oa,
// zb' = zb + ob:
//   acc = sum a'*b' - zb' * rowsum(a') - za' * colsum(b') + K * za' * zb'
//       = sum a'*b' - zb' * (rowsum(a') - K * za') - za' * colsum(b'),
// where rowsum(a') = rowsum(a) + K * oa and colsum(b') = colsum(b) + K * ob.
//
// fused(batch, m0, rows, n0, cols) -> FusedOutput: where it names multipliers, and the entry has a
// kernel_requantized, a block whose K fits one kernel call, whose A is row-major with one za' for its
// rows and whose output has no row term runs that kernel (the ONNX Runtime epilogue in registers) in
// place of the kernels and epilogue.
struct FusedOutput {
  const float* multiplier = nullptr;  // the block's columns' (every row's), or null: not fused
  int32_t zp = 0;  // every column's output zero point
  bool y_signed = false;
  uint8_t* y = nullptr;  // output (m0, n0)
  int64_t ldy = 0;
  const QLinearAddStage* add = nullptr;  // applied to the block once written, or null
};
struct NoFusion {
  FusedOutput operator()(int64_t, int64_t, int64_t, int64_t, int64_t) const { return {}; }
};
// The QLinearAdd stage on a block of the output just written: rows rows of cols codes at y (row stride
// ldy), output rows from row0 (batch * M + m), columns from n0, in place.
void add_stage(const QLinearAddStage& add, bool is_signed, uint8_t* y, int64_t ldy, int64_t rows, int64_t row0,
               int64_t n0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = y + r * ldy;
    for (const QLinearAddStage* s = &add; s; s = s->next) {  // each add on the row while it is in cache
      const uint8_t* codes = static_cast<const uint8_t*>(s->codes) + (row0 + r) * s->ld + n0;
      qlinear_add_span(s->product_first ? row : codes, s->product_first ? codes : row, cols, is_signed, s->rx, s->ry,
                       s->k, row);
    }
  }
}
template <class Acc, class Epilogue, class Fused = NoFusion>
void accumulate(const QGemmDispatch& q, const QGemmProblem& p, Epilogue&& epilogue, Fused&& fused = Fused{}) {
  constexpr bool kExact = std::is_same_v<Acc, int64_t>;
  if (kExact && p.column_bias) throw std::invalid_argument("a column bias is added to int32 sums only");
  const QGemmLayout& L = *q.layout;
  const int64_t M = p.M, N = p.N, K = p.K, groups = L.k_groups(K), mr = L.mr, nr = L.nr;
  const int64_t a_row = L.a_row_int32s(K);  // packed A's int32s per row
  if (M == 0 || N == 0 || p.batch == 0) return;

  // The layout's blocking (csrc/qgemm.h), unless set_qgemm_blocking replaced it.
  const QGemmBlocking blocking = qgemm_blocking(L);
  int64_t block_rows = blocking.task_rows;
  const int64_t task_panel_bytes = blocking.task_panel_bytes;
  const int64_t k_block = blocking.k_block, tasks_per_thread = blocking.tasks_per_thread;
  const int64_t panels_total = L.n_panels(N);
  const int64_t panel_bytes = L.panel_bytes(K);
  const int64_t threads = get_num_threads();
  const int64_t a_count = *std::max_element(p.a_index, p.a_index + p.batch) + 1;
  const int64_t za_ld = zero_point_ld(p.a_zero_point_ld, M), zb_ld = zero_point_ld(p.b_zero_point_ld, N);
  // (the zero points' elements, every matrix's: M and N where the matrices share theirs)
  const int64_t za_count = (a_count - 1) * za_ld + M, zb_count = b_zero_points(p);
  // Small products with b per call (K <= 128 and N <= 64: attention's batches, 16 x 32 x 16 each): the
  // entry's small_product reads a and b in place and returns final sums, no packing, no row or
  // column sums here; a matrix's rows in one block up to kSmallProductBlockWork (its b prepared once).
  // Faster than the packed kernels at every such shape measured (up to 4096 x 128 x 64, Zen 4: the
  // per-call packing of b and the terms cost more than the small kernels' narrower tiles). (A column
  // bias comes only with a packed weight: QGemm's, QLinearConv's.)
  const bool small = !kExact && q.small_product && !p.b_packed && !p.a_offsets && !p.column_bias &&
                     K <= kSmallProductMaxK && N <= kSmallProductMaxCols &&
                     zero_points_in_range(p.a_zero_point, za_count, p.a_signed) &&
                     zero_points_in_range(p.b_zero_point, zb_count, p.b_signed);
  if (small)
    block_rows = std::min(M, std::max<int64_t>(8, kSmallProductBlockWork / std::max<int64_t>(K * N, 1) / 8 * 8));
  // Panels per task: the layout's cache-sized block of b; with b given per call, fewer where that
  // leaves a thread that the call's work is worth (20 us each at about 100 multiply-adds per
  // nanosecond, as below) without a column block: each such task packs its own columns, and at
  // 1024^3 a 1 MB block was all of b, the call on one thread.
  const int64_t cache_panels =
      std::max<int64_t>(1, std::min(panels_total, task_panel_bytes / std::max<int64_t>(panel_bytes, 1)));
  const double call_ns =
      static_cast<double>(p.batch) * static_cast<double>(M) * static_cast<double>(K) * static_cast<double>(N) / 100.0;
  const int64_t worth_threads = std::clamp<int64_t>(static_cast<int64_t>(call_ns / 20000.0), 1, threads);
  const int64_t blocks_wanted = p.b_packed ? 1 : (worth_threads + p.batch - 1) / p.batch;
  int64_t panels_per_task = std::min(cache_panels, (panels_total + blocks_wanted - 1) / blocks_wanted);
  // A constant b over 1 MiB packed (read from memory or L3 each call) beside an a of at most
  // kColumnSplitA bytes (it stays in each core's L2 however many tasks read it): narrower column
  // blocks, down to one panel, before runs of rows (below), since each run reads its column block
  // of b from memory again. At 128 x 4096 x 4096 on the AMX layout, 16 threads, the layout's 1 MiB
  // blocks made 16 column blocks and 2 runs of 64 rows: b (16 MiB) streamed twice per call.
  const bool narrow_columns =
      p.b_packed && blocking_override.task_rows == 0 &&
      panels_total * panel_bytes * static_cast<int64_t>(p.b_packed->count) > (int64_t{1} << 20) &&
      a_count * M * K <= kColumnSplitA;
  if (narrow_columns) {
    const int64_t wanted_tasks = tasks_per_thread * threads;
    panels_per_task =
        std::clamp<int64_t>(panels_total * p.batch / std::max<int64_t>(wanted_tasks, 1), 1, panels_per_task);
  }
  const int64_t col_blocks = (panels_total + panels_per_task - 1) / panels_per_task;
  // the same number of blocks, of even widths (48 panels in blocks of at most 42: 24 and 24, not 42 and
  // 6; 16 x 384 x 1536 on 2 threads 1.05-1.1x alone, unchanged inside all-MiniLM-L6-v2's run, Zen 4)
  panels_per_task = (panels_total + col_blocks - 1) / col_blocks;
  // A constant b of at most 1 MiB packed (it stays in cache, however often it is read): rows per task
  // down to the kernel's mr where the layout's would leave fewer than tasks_per_thread tasks per
  // thread, so that a helper that wakes late finds work left (64x384x384 on 2 threads: 2 tasks of
  // 32 rows, the caller then waiting for the helper's; 8 of 8 rows: 1.11x, Zen 4).
  if (p.b_packed && blocking_override.task_rows == 0 &&
      panels_total * panel_bytes * static_cast<int64_t>(p.b_packed->count) <= (int64_t{1} << 20)) {
    const int64_t wanted_tasks = tasks_per_thread * threads, have_blocks = p.batch * col_blocks;
    const int64_t rows_wanted = (M * have_blocks + wanted_tasks - 1) / wanted_tasks;
    block_rows = std::clamp<int64_t>((rows_wanted + mr - 1) / mr * mr, mr, block_rows);
  }
  const int64_t row_blocks = (M + block_rows - 1) / block_rows;
  // Exact sums fold the int32 kernel sums into int64 every 2^15 k; wrapped ones need not.
  const int64_t groups_per_chunk = kExact ? kKPerChunk / L.kc : std::max<int64_t>(groups, 1);
  const int64_t groups_per_block = std::max<int64_t>(1, k_block / L.kc);
  const bool b_signed = p.b_packed ? p.b_packed->is_signed : p.b_signed;
  const int64_t oa = L.a_offset[p.a_signed], ob = L.b_offset[b_signed];

  // Tasks over (matrix, column block, run of row blocks), each sweeping its row blocks over one
  // column block of b, which stays in the core's L2 between them (b is read from memory once per
  // run, not once per row block). A constant b is packed already; b given per call is packed by
  // each task, its own columns only, into a cache-sized buffer (no full-size packed copy of b, no
  // page faults for one). A run is all of M unless that leaves too few tasks: with a constant b,
  // fewer than tasks_per_thread (16) per thread (the tail of a call: at most a sixteenth of a share); with b per call,
  // a thread worth waking without one (a narrow b), each run then packing its column block again
  // (K * 32 bytes per panel: little beside its rows' work).
  // With narrowed columns, kMinTasksPerThread column blocks per thread are enough.
  const int64_t have = p.batch * col_blocks, wanted = !p.b_packed ? worth_threads
                                                      : narrow_columns
                                                          ? std::min(tasks_per_thread, kMinTasksPerThread) * threads
                                                          : tasks_per_thread * threads;
  const int64_t runs = have >= wanted ? 1 : std::min(row_blocks, (wanted + have - 1) / have);
  const int64_t run_blocks = (row_blocks + runs - 1) / runs;
  // About 100 multiply-adds per nanosecond on one thread (AVX2 at many rows; fewer on one row): a
  // small product stays on fewer threads.
  const double task_ns = static_cast<double>(std::min(run_blocks * block_rows, M)) * static_cast<double>(K) *
                         static_cast<double>(panels_per_task * nr) / 100.0;
  // The helpers the products want, awake from here on (a ParallelRegion): their wake-up overlaps
  // the setup and the packing of A (a job of its own) below instead of following each.
  const ParallelRegion region(
      static_cast<int>(std::min<int64_t>(threads, have * runs / tasks_worth_a_thread(task_ns))));

  // Pack every distinct matrix of a once (mr-row groups) with its row sums, unless a is its own
  // packed form (a row-major layout, a stored as given, K whole k-groups: the common uint8 a x int8 b
  // on the VNNI layout; then each task sums its own rows) or a small product reads it; the row sums
  // only where a column's zb' = zb + ob is not 0 (they are multiplied by it: an int8 b with zero point
  // 0, the usual weight, needs none).
  const bool need_rowsums = !small && needs_row_sums(p, zb_count, ob);
  // A read through a table of receptive fields (a convolution without an im2col): the entry's
  // kernel_taps reads it in place, no packing and no row sums (its caller checks taps_usable()).
  const bool a_taps = p.a_offsets != nullptr;
  if (a_taps && (kExact || !taps_usable(q, p.a_signed, need_rowsums, p.batch, K, p.a_taps)))
    throw std::logic_error("a table of receptive fields on an entry that cannot read it");
  const bool a_in_place =
      small || a_taps || (L.a_row_major && oa == 0 && K % L.kc == 0 && reinterpret_cast<uintptr_t>(p.a) % 4 == 0);
  const int64_t m_padded = a_in_place ? M : (M + mr - 1) / mr * mr;
  // Uninitialized: pack_a writes every int32 the kernels read (padding rows too where they read
  // them). Kept by the calling thread for its next call (up to 64 MiB): a fresh buffer per call
  // costs page faults.
  const size_t a_int32s = a_in_place ? 0 : static_cast<size_t>(a_count * m_padded * a_row);
  thread_local Buffer<int32_t> a_kept;
  thread_local size_t a_kept_size = 0;
  Buffer<int32_t> a_once;
  int32_t* a_buffer = nullptr;  // packed a (none when read in place)
  if (!a_in_place) {
    if (a_int32s <= a_kept_size) {
      a_buffer = a_kept.get();
    } else if (a_int32s * sizeof(int32_t) <= (size_t{64} << 20)) {
      a_kept = alloc_buffer<int32_t>(a_int32s);
      a_kept_size = a_int32s;
      a_buffer = a_kept.get();
    } else {
      a_once = alloc_buffer<int32_t>(a_int32s);
      a_buffer = a_once.get();
    }
  }
  const int32_t* a_packed_data = a_in_place ? static_cast<const int32_t*>(p.a) : a_buffer;
  // Blocks that may run the kernel with the epilogue in registers (fused, above): K in one kernel
  // call, A row-major (read in place, or packed: int8 a as a + 128), no row term.
  const bool fusable = !kExact && !std::is_same_v<std::decay_t<Fused>, NoFusion> && !small && !need_rowsums &&
                       groups >= 1 &&
                       (a_taps ? q.kernel_taps_requantized != nullptr
                               : q.kernel_requantized && L.a_row_major && groups <= groups_per_block);
  // The row sums, where needed: with the packing (below), or by each task for its own rows where a is
  // read in place (no job of its own to wake the helpers for: a row sum is one addition per byte of a
  // row that the task then multiplies by a block of columns).
  std::vector<int64_t> rowsums(need_rowsums && !a_in_place ? static_cast<size_t>(a_count * M) : 0);
  // Tasks of one row group each (at M = 128, blocks of 64 rows gave the AMX layout's packing two
  // threads of 16), worth a thread at about 1 byte per nanosecond.
  const int64_t a_groups = (M + mr - 1) / mr;
  if (!a_in_place)
    parallel_for(
        a_count * a_groups,
        [&](int64_t task) {
          const int64_t ia = task / a_groups, m0 = task % a_groups * mr;
          const int64_t rows = std::min(mr, M - m0);
          const auto* a_bytes = static_cast<const uint8_t*>(p.a) + (ia * M + m0) * K;
          q.pack_a(a_bytes, p.a_signed, rows, K, K, a_buffer + (ia * m_padded + m0) * a_row);
          if (need_rowsums)
            for (int64_t r = 0; r < rows; ++r) rowsums[ia * M + m0 + r] = row_sum(a_bytes + r * K, K, p.a_signed);
        },
        tasks_worth_a_thread(static_cast<double>(mr * K)));

  // One block of the output: rows [m0, m0 + rows) x panels [panel0, panel0 + panels) of matrix bt,
  // given those panels of b packed at b_panels (panel stride panel_bytes) and their column sums
  // (both null for a small product, which reads b in place).
  auto compute_block = [&](TaskScratch<Acc>& scratch, int64_t bt, int64_t m0, int64_t panel0, const int8_t* b_panels,
                           const int32_t* colsum) {
    auto &c32 = scratch.c32, &block_rowsums = scratch.rowsums;
    auto& c64 = scratch.c64;
    auto &zb_stored = scratch.zb_stored, &colsum_stored = scratch.colsum_stored;
    auto& row_terms = scratch.row_terms;
    const int64_t rows = std::min(block_rows, M - m0);
    const int64_t panels = std::min(panels_per_task, panels_total - panel0);
    const int64_t n0 = panel0 * nr, cols = std::min(panels * nr, N - n0);
    const int64_t ia = p.a_index[bt], ib = p.b_index[bt];
    const int64_t ldc = panels * nr;
    const int32_t* a_block = a_packed_data + (ia * m_padded + m0) * a_row;
    const int64_t* rowsum = need_rowsums && !a_in_place ? rowsums.data() + ia * M + m0 : nullptr;
    if (need_rowsums && a_in_place) {
      block_rowsums.resize(static_cast<size_t>(rows));
      const auto* a_bytes = static_cast<const uint8_t*>(p.a) + (ia * M + m0) * K;
      for (int64_t r = 0; r < rows; ++r) block_rowsums[r] = row_sum(a_bytes + r * K, K, p.a_signed);
      rowsum = block_rowsums.data();
    }

    const int32_t* b_zp = p.b_zero_point + ib * zb_ld + n0;
    const int32_t* bias = p.column_bias ? p.column_bias + ib * N + n0 : nullptr;
    const int32_t* a_zp = p.a_zero_point + ia * za_ld + m0;
    auto wrap = [](int64_t x) { return static_cast<Acc>(static_cast<std::make_unsigned_t<Acc>>(x)); };
    const bool uniform_za = std::all_of(a_zp, a_zp + rows, [&](int32_t z) { return z == a_zp[0]; });
    const int64_t za0 = int64_t{a_zp[0]} + oa;
    // The column terms zb' and colsum(b') (times za', less the bias, where the rows share za'), once per
    // task where its blocks share za' (at K = 16, 96 columns, the loop cost a fifth of a block's products).
    auto column_terms = [&] {
      if (scratch.columns_ready && scratch.columns_uniform == uniform_za && (!uniform_za || scratch.columns_za == za0))
        return;
      zb_stored.resize(static_cast<size_t>(cols));
      colsum_stored.resize(static_cast<size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) {
        zb_stored[j] = wrap(int64_t{b_zp[j]} + ob);
        colsum_stored[j] = wrap(int64_t{colsum[j]} + K * ob);
        // (wrapping: za' * colsum(b') - bias modulo 2^32, as the epilogue's za' * colsum and + bias would give)
        if (uniform_za) colsum_stored[j] = wrap(za0 * int64_t{colsum_stored[j]} - (bias ? bias[j] : 0));
      }
      scratch.columns_ready = true, scratch.columns_uniform = uniform_za, scratch.columns_za = za0;
    };
    if (q.begin_task) q.begin_task();
    if constexpr (!kExact) {
      const FusedOutput out = fusable && uniform_za ? fused(bt, m0, rows, n0, cols) : FusedOutput{};
      if (out.multiplier) {  // the kernel with the epilogue in registers: acc = sums - colsum_stored
        column_terms();
        for (int64_t j = 0; j < panels; ++j)
          for (int64_t r0 = 0; r0 < rows; r0 += mr) {
            const int32_t* colterm = colsum_stored.data() + j * nr;
            const int64_t group_rows = std::min(mr, rows - r0), panel_cols = std::min(nr, cols - j * nr);
            uint8_t* y = out.y + r0 * out.ldy + j * nr;
            if (a_taps)
              q.kernel_taps_requantized(static_cast<const uint8_t*>(p.a), p.a_offsets + (m0 + r0) * p.a_taps, p.a_taps,
                                        p.a_pad, group_rows, groups / p.a_taps, b_panels + j * panel_bytes, colterm,
                                        out.multiplier + j * nr, out.zp, out.y_signed, panel_cols, y, out.ldy);
            else
              q.kernel_requantized(a_block + r0 * a_row, a_row, group_rows, b_panels + j * panel_bytes, groups, colterm,
                                   out.multiplier + j * nr, out.zp, out.y_signed, panel_cols, y, out.ldy);
          }
        if (out.add) add_stage(*out.add, out.y_signed, out.y, out.ldy, rows, bt * M + m0, n0, cols);
        return;
      }
    }
    c32.resize(static_cast<size_t>(rows * ldc));
    if (kExact) c64.assign(static_cast<size_t>(rows * ldc), 0);
    if (small)
      q.small_product(static_cast<const uint8_t*>(p.a) + (ia * M + m0) * K, p.a_signed, K, a_zp,
                      static_cast<const uint8_t*>(p.b_raw) + ib * K * N + n0, b_signed, N, b_zp, rows, K, cols,
                      c32.data(), ldc);
    if (a_taps) {  // all of K in one call per row group and panel
      for (int64_t j = 0; j < panels; ++j)
        for (int64_t r0 = 0; r0 < rows; r0 += mr)
          q.kernel_taps(static_cast<const uint8_t*>(p.a), p.a_offsets + (m0 + r0) * p.a_taps, p.a_taps, p.a_pad,
                        std::min(mr, rows - r0), groups / p.a_taps, b_panels + j * panel_bytes,
                        c32.data() + r0 * ldc + j * nr, ldc);
    }
    for (int64_t c0 = 0; !a_taps && !small && c0 < std::max<int64_t>(groups, 1); c0 += groups_per_chunk) {
      const int64_t c1 = std::min(groups, c0 + groups_per_chunk);
      int64_t g0 = c0;
      do {  // at least once: K = 0 still writes C
        const int64_t g1 = std::min(c1, g0 + groups_per_block);
        for (int64_t j = 0; j < panels; ++j)
          for (int64_t r0 = 0; r0 < rows; r0 += mr)
            q.kernel(a_block + r0 * a_row, a_row, std::min(mr, rows - r0), b_panels + j * panel_bytes, g0, g1, b_signed,
                     g0 > c0, c32.data() + r0 * ldc + j * nr, ldc);
        g0 = g1;
      } while (g0 < c1);
      if (kExact)
        for (int64_t i = 0; i < rows * ldc; ++i) c64[i] += c32[i];
    }
    if (small) {  // the sums are final: no column or row term
      colsum_stored.assign(static_cast<size_t>(cols), Acc{0});
      row_terms.assign(static_cast<size_t>(rows), TermsOf<Acc>{nullptr, colsum_stored.data(), Acc{1}, Acc{0}});
    } else {
      // The zero-point terms, in Acc: wrapped to int32 (the epilogue's arithmetic wraps), exact in int64.
      // Where every row of the block has the same za' (a per-tensor zero point: every convolution, most
      // products), the column term za' * colsum(b') is formed once per column, with za' then 1 in the
      // row terms (no multiply per output in the epilogue); a column bias (int32 sums only) joins it
      // there, else it is added to the sums here. Where every column has the same zb' (a per-tensor
      // zero point), the row term zb' * t is formed once per row (RowTerms' zb null).
      const bool uniform_zb = std::all_of(b_zp, b_zp + cols, [&](int32_t z) { return z == b_zp[0]; });
      if (bias && !uniform_za) {  // (added as the int32 sums add: wrapping, through uint32)
        for (int64_t r = 0; r < rows; ++r) {
          int32_t* c = c32.data() + r * ldc;
          for (int64_t j = 0; j < cols; ++j)
            c[j] = static_cast<int32_t>(static_cast<uint32_t>(c[j]) + static_cast<uint32_t>(bias[j]));
        }
      }
      const int64_t zb0 = int64_t{b_zp[0]} + ob;
      column_terms();
      row_terms.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t za = int64_t{a_zp[r]} + oa;
        // t = rowsum(a') - K * za'; without row sums every zb' is 0, and so is the row's term
        const Acc t = need_rowsums ? wrap(rowsum[r] + K * oa - K * za) : Acc{0};
        const bool per_column = need_rowsums && !uniform_zb;
        row_terms[r] = {per_column ? zb_stored.data() : nullptr, colsum_stored.data(), uniform_za ? Acc{1} : wrap(za),
                        per_column ? t : wrap(zb0 * int64_t{t})};
      }
    }
    if constexpr (kExact) epilogue(bt, m0, rows, n0, cols, c64.data(), ldc, row_terms.data());
    else epilogue(bt, m0, rows, n0, cols, c32.data(), ldc, row_terms.data());
  };

  // Tasks of less than about 2 us (attention's batches of small products: 96 of 16 x 32 x 16) come
  // in runs of several per pool task, keeping 4 pool tasks per thread where there are that many.
  const int64_t tasks = have * runs;
  const int64_t per_pool_task = std::clamp<int64_t>(
      std::min<int64_t>(static_cast<int64_t>(2000.0 / std::max(task_ns, 1.0)), tasks / (4 * threads)), 1, tasks);
  auto run_task = [&](TaskScratch<Acc>& scratch, int64_t task) {
    const int64_t bt = task / (col_blocks * runs), ib = p.b_index[bt];
    const int64_t panel0 = (task / runs) % col_blocks * panels_per_task;
    const int64_t block0 = task % runs * run_blocks, block1 = std::min(row_blocks, block0 + run_blocks);
    const int8_t* b_panels;
    const int32_t* colsum;
    if (p.b_packed) {
      b_panels = p.b_packed->matrix(ib) + panel0 * panel_bytes;
      colsum = p.b_packed->colsum.data() + ib * N + panel0 * nr;
    } else if (small) {  // read in place by the small products
      b_panels = nullptr;
      colsum = nullptr;
    } else {
      const int64_t panels = std::min(panels_per_task, panels_total - panel0);
      scratch.b_block.resize(static_cast<size_t>(panels * panel_bytes));
      scratch.b_colsum.resize(static_cast<size_t>(N));
      const auto* b_matrix = static_cast<const uint8_t*>(p.b_raw) + ib * K * N;
      q.pack_b_panels(b_matrix, b_signed, K, N, panel0, panel0 + panels, scratch.b_block.data(),
                      scratch.b_colsum.data());
      b_panels = scratch.b_block.data();
      colsum = scratch.b_colsum.data() + panel0 * nr;
    }
    scratch.columns_ready = false;  // (another column block, or matrix, than the thread's last task's)
    for (int64_t block = block0; block < block1; ++block)
      compute_block(scratch, bt, block * block_rows, panel0, b_panels, colsum);
  };
  parallel_for((tasks + per_pool_task - 1) / per_pool_task,
               [&](int64_t pool_task) {
                 thread_local TaskScratch<Acc> scratch;
                 const int64_t t0 = pool_task * per_pool_task, t1 = std::min(tasks, t0 + per_pool_task);
                 for (int64_t task = t0; task < t1; ++task) run_task(scratch, task);
               },
               tasks_worth_a_thread(task_ns * static_cast<double>(per_pool_task)));
}

// Runs the accumulation (Acc: see accumulate) and writes requantize(acc, b, m, n, zp, qmin, qmax)
// into the 8-bit output.
template <class Acc, class Requantize>
void run(const QGemmProblem& p, const QOutput& out, Requantize&& requantize) {
  const int32_t qmin = out.is_signed ? -128 : 0, qmax = out.is_signed ? 127 : 255;
  const int64_t M = p.M, N = p.N;
  accumulate<Acc>(call_entry(p), p,
                  [&](int64_t bt, int64_t m0, int64_t rows, int64_t n0, int64_t cols, const Acc* raw_block, int64_t ld,
                      const TermsOf<Acc>* terms) {
                    for (int64_t r = 0; r < rows; ++r) {
                      const int64_t m = m0 + r, base = (bt * M + m) * N + n0;
                      const Acc* raw = raw_block + r * ld;
                      for (int64_t j = 0; j < cols; ++j) {
                        const int32_t q = requantize(terms_applied(raw, terms[r], j), bt, m, n0 + j,
                                                     out.zero_point(bt, m, n0 + j), qmin, qmax);
                        if (out.is_signed) static_cast<int8_t*>(out.data)[base + j] = static_cast<int8_t>(q);
                        else static_cast<uint8_t*>(out.data)[base + j] = static_cast<uint8_t>(q);
                      }
                    }
                  });
}

// Values view(b, m, n0 .. n0+count) as a contiguous array: the view itself when it is contiguous
// along n, else a copy. A view that does not vary with m (a per-tensor or per-column parameter,
// broadcast) is copied once per (call, b, n0, count) and thread, not once per row: `call` tells
// calls apart, since another call's arrays may sit at the same addresses.
template <class T>
class RowOf {
 public:
  const T* operator()(const View3<T>& view, uint64_t call, int64_t b, int64_t m, int64_t n0, int64_t count) {
    const T* start = &view.data[b * view.stride_batch + m * view.stride_m + n0 * view.stride_n];
    if (view.stride_n == 1) return start;
    if (view.stride_m == 0 && call == call_ && start == start_ && n0 == n0_ && count == count_) return buffer_.data();
    buffer_.resize(static_cast<size_t>(count));
    for (int64_t j = 0; j < count; ++j) buffer_[j] = view(b, m, n0 + j);
    call_ = call, start_ = start, n0_ = n0, count_ = count;
    return buffer_.data();
  }

 private:
  std::vector<T> buffer_;
  uint64_t call_ = 0;  // calls are numbered from 1
  const T* start_ = nullptr;
  int64_t n0_ = -1, count_ = -1;
};

std::atomic<uint64_t> calls{0};

}  // namespace

void qlinear_matmul_onnxruntime(const QGemmProblem& p, View3<float> multiplier, QOutput out) {
  const QGemmDispatch& q = call_entry(p);  // one entry for the products and the epilogue
  const RequantizeRows requantize_rows = q.requantize_onnxruntime;
  const int64_t M = p.M, N = p.N;
  const uint64_t call = ++calls;
  // A parameter contiguous along n, or the same for every row (per tensor, per column): one call for the
  // block's rows, the parameter's rows ld apart (0: one row for all); else (per row, broadcast along n)
  // a call per row, each with its row of copies.
  auto row_step = [](const auto& view) -> std::optional<int64_t> {
    if (view.stride_n == 1) return view.stride_m;
    if (view.stride_m == 0) return 0;
    return std::nullopt;
  };
  const auto multiplier_ld = row_step(multiplier), zp_ld = row_step(out.zero_point);
  thread_local RowOf<int32_t> zp_row;
  thread_local RowOf<float> multiplier_row;
  // The kernel with the epilogue in registers where the block's rows share their multipliers and every
  // column has one output zero point (a per-tensor y zero point: QLinearMatMul's, QLinearConv's).
  const bool fusable = multiplier_ld == 0 && zp_ld == 0;
  auto fused = [&](int64_t bt, int64_t m0, int64_t, int64_t n0, int64_t cols) -> FusedOutput {
    if (!fusable) return {};
    const int32_t* zp = zp_row(out.zero_point, call, bt, m0, n0, cols);
    if (!std::all_of(zp, zp + cols, [&](int32_t z) { return z == zp[0]; })) return {};
    return {multiplier_row(multiplier, call, bt, m0, n0, cols),       zp[0], out.is_signed,
            static_cast<uint8_t*>(out.data) + (bt * M + m0) * N + n0, N,     out.add};
  };
  accumulate<int32_t>(
      q, p,
      [&](int64_t bt, int64_t m0, int64_t rows, int64_t n0, int64_t cols, const int32_t* raw, int64_t ld,
          const RowTerms* terms) {
        RowOf<int32_t>& zp_of = zp_row;
        RowOf<float>& multiplier_of = multiplier_row;
        auto* y = static_cast<uint8_t*>(out.data) + (bt * M + m0) * N + n0;
        if (multiplier_ld && zp_ld) {
          requantize_rows(raw, ld, terms, rows, multiplier_of(multiplier, call, bt, m0, n0, cols), *multiplier_ld,
                          zp_of(out.zero_point, call, bt, m0, n0, cols), *zp_ld, cols, out.is_signed, y, N);
        } else {
          for (int64_t r = 0; r < rows; ++r)
            requantize_rows(raw + r * ld, ld, terms + r, 1, multiplier_of(multiplier, call, bt, m0 + r, n0, cols), 0,
                            zp_of(out.zero_point, call, bt, m0 + r, n0, cols), 0, cols, out.is_signed, y + r * N, N);
        }
        if (out.add) add_stage(*out.add, out.is_signed, y, N, rows, bt * M + m0, n0, cols);
      },
      fused);
}

bool taps_usable(const QGemmProblem& p) {
  const QGemmDispatch& q = call_entry(p);
  const int32_t ob = q.layout->b_offset[p.b_packed ? p.b_packed->is_signed : p.b_signed];
  return taps_usable(q, p.a_signed, needs_row_sums(p, b_zero_points(p), ob), p.batch, p.K, p.a_taps);
}

void matmul_integer(const QGemmProblem& p, int32_t* y) {
  const int64_t M = p.M, N = p.N;
  accumulate<int32_t>(call_entry(p), p,
                      [&](int64_t bt, int64_t m0, int64_t rows, int64_t n0, int64_t cols, const int32_t* raw,
                          int64_t ld, const RowTerms* terms) {
                        for (int64_t r = 0; r < rows; ++r) {
                          int32_t* row = y + (bt * M + m0 + r) * N + n0;
                          for (int64_t j = 0; j < cols; ++j) row[j] = row_terms_applied(raw + r * ld, terms[r], j);
                        }
                      });
}

void matmul_integer_scaled(const QGemmProblem& p, const float* scale, bool scale_per_column, const float* bias,
                           float* y) {
  matmul_integer_scaled(p, scale, scale_per_column, bias, {ColumnSpan{0, p.N, y}});
}

void matmul_integer_scaled(const QGemmProblem& p, const float* scale, bool scale_per_column, const float* bias,
                           const std::vector<ColumnSpan>& spans) {
  const int64_t M = p.M;
  accumulate<int32_t>(call_entry(p), p,
                      [&](int64_t bt, int64_t m0, int64_t rows, int64_t n0, int64_t cols, const int32_t* raw,
                          int64_t ld, const RowTerms* terms) {
                        for (const ColumnSpan& span : spans) {  // the block's columns each span holds
                          const int64_t lo = std::max(n0, span.begin), hi = std::min(n0 + cols, span.end);
                          const int64_t width = span.end - span.begin;
                          for (int64_t r = 0; r < rows && lo < hi; ++r) {
                            float* row = span.y + (bt * M + m0 + r) * width - span.begin;  // (column n at row[n])
                            // (-ffp-contract=off: the multiply and the add round apart, as the two nodes)
                            for (int64_t n = lo; n < hi; ++n)
                              row[n] = static_cast<float>(row_terms_applied(raw + r * ld, terms[r], n - n0)) *
                                       scale[scale_per_column ? n : 0];
                            if (bias)
                              for (int64_t n = lo; n < hi; ++n) row[n] = row[n] + bias[n];
                          }
                        }
                      });
}

void qlinear_matmul_onnx_reference(const QGemmProblem& p, View3<double> multiplier, QOutput out) {
  run<int32_t>(p, out, [&](int32_t acc, int64_t b, int64_t m, int64_t n, int32_t zp, int32_t qmin, int32_t qmax) {
    return requantize_onnx_reference(acc, multiplier(b, m, n), zp, qmin, qmax);
  });
}

void qlinear_matmul_exact(const QGemmProblem& p, View3<float> a_scale, View3<float> b_scale, View3<float> y_scale,
                          QOutput out) {
  run<int64_t>(p, out, [&](int64_t acc, int64_t b, int64_t m, int64_t n, int32_t zp, int32_t qmin, int32_t qmax) {
    return requantize_exact(acc, a_scale(b, m, n), b_scale(b, m, n), y_scale(b, m, n), zp, qmin, qmax);
  });
}

void matmul_i64_exact128(int64_t batch, int64_t M, int64_t N, int64_t K, const int64_t* a, const int64_t* a_index,
                         const int64_t* b, const int64_t* b_index, int64_t* out_hi, uint64_t* out_lo) {
  parallel_for(batch * M, [&](int64_t row) {
    const int64_t bt = row / M, m = row % M;
    const int64_t* A = a + a_index[bt] * M * K;
    const int64_t* B = b + b_index[bt] * K * N;
    std::vector<__int128> acc(N);
    for (int64_t k = 0; k < K; ++k) {
      const __int128 av = A[m * K + k];
      const int64_t* brow = B + k * N;
      for (int64_t n = 0; n < N; ++n) acc[n] += av * brow[n];
    }
    const int64_t base = (bt * M + m) * N;
    for (int64_t n = 0; n < N; ++n) {
      out_hi[base + n] = static_cast<int64_t>(acc[n] >> 64);
      out_lo[base + n] = static_cast<uint64_t>(acc[n]);
    }
  });
}

}  // namespace qmm
