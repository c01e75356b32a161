// peak.cpp: measures the active int8 kernel's throughput on cache-resident data, the "peak" the benchmarks quote against.
#include "peak.h"

#include <atomic>
#include <chrono>
#include <vector>

#include "qgemm.h"
#include "thread_pool.h"

namespace qmm {

double measure_peak_gops(double seconds) {
  const QGemmKernels& kernels = active_kernels();
  constexpr int64_t K = 512, panels = 4, pairs = K / 2;  // A 4 KB + B 32 KB: L1/L2 resident
  const int threads = get_num_threads();
  std::atomic<int64_t> tiles{0};
  const auto start = std::chrono::steady_clock::now();
  parallel_for(threads, [&](int64_t) {
    std::vector<int32_t> a(kMr * pairs, 0x00010001);
    std::vector<int8_t> b(panels * pairs * 2 * kNr, 1);
    std::vector<int32_t> c(kMr * panels * kNr);
    int64_t done = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
      for (int rep = 0; rep < 16; ++rep) {
        for (int64_t j = 0; j < panels; ++j)
          kernels.kernel(a.data(), kMr, b.data() + j * pairs * 2 * kNr, 0, pairs, true, c.data() + j * kNr,
                         panels * kNr);
        done += 1;
      }
    }
    tiles += done;
  });
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double macs = static_cast<double>(tiles.load()) * kMr * panels * kNr * K;
  return 2.0 * macs / elapsed / 1e9;
}

}  // namespace qmm
