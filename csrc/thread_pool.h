// thread_pool.h: a persistent pool of worker threads and parallel_for over a range of tasks.
#pragma once

#include <cstdint>
#include <functional>

namespace qmm {

// Number of threads kernels use (the caller included). Default: QUANTMATMUL_NUM_THREADS if set,
// else the CPUs this process may run on (sched_getaffinity), else hardware_concurrency.
int get_num_threads();
void set_num_threads(int n);

// Runs task(i) for i in [0, count) on up to get_num_threads() threads (the calling thread takes part)
// and returns when all are done. Tasks are handed out dynamically, so uneven tasks balance. Safe to
// call from several threads at once: concurrent calls are serialized on the pool, and a call made
// from inside a task runs inline.
void parallel_for(int64_t count, const std::function<void(int64_t)>& task);

}  // namespace qmm
