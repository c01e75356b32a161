// peak.cpp: measures the int8 kernel in use on cache-resident data: the "peak" the benchmarks quote against.
#include "peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "dispatch.h"
#include "thread_pool.h"

namespace qmm {

namespace {

// One sample: every thread runs the kernel for about `seconds`.
double sample_peak_gops(double seconds) {
  const QGemmDispatch& q = qgemm_kernels();
  const QGemmLayout& L = *q.layout;
  // A mr x K and B 128 columns x K, L2 resident; calls of 2,048 k (a call's start and end, a drain
  // of its accumulator chains and C's store and load, cost several percent at 512 k: the drivers
  // run calls of 2,048 k and more).
  const int64_t K = 2048;
  const int64_t panels = 128 / L.nr, groups = L.k_groups(K);
  const int threads = get_num_threads();
  std::atomic<int64_t> tiles{0};
  const auto start = std::chrono::steady_clock::now();
  parallel_for(threads, [&](int64_t) {
    if (q.begin_task) q.begin_task();
    std::vector<int32_t> a(static_cast<size_t>(L.packed_a_int32s(L.mr, K)), 0x01010101);
    std::vector<int8_t> b(static_cast<size_t>(panels * L.panel_bytes(K)), 1);
    std::vector<int32_t> c(static_cast<size_t>(L.mr * panels * L.nr));
    int64_t done = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
      for (int rep = 0; rep < 16; ++rep) {
        for (int64_t j = 0; j < panels; ++j)
          q.kernel(a.data(), L.a_row_int32s(K), L.mr, b.data() + j * L.panel_bytes(K), 0, groups, true, false,
                   c.data() + j * L.nr, panels * L.nr);
        done += 1;
      }
    }
    tiles += done;
  });
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double macs = static_cast<double>(tiles.load()) * L.mr * panels * L.nr * K;
  return 2.0 * macs / elapsed / 1e9;
}

}  // namespace

// The best of five samples: a peak is what the kernel can do, and on a shared machine a single
// sample can land in another tenant's burst (one 0.5 s sample on a busy VM read low enough to put
// kernels at 116-171 % of it).
double measure_peak_gops(double seconds) {
  double best = 0.0;
  for (int i = 0; i < 5; ++i) best = std::max(best, sample_peak_gops(seconds / 5));
  return best;
}

}  // namespace qmm
