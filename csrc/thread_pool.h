// thread_pool.h: a persistent pool of worker threads and parallel_for over a range of tasks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace qmm {

// Number of threads kernels use (the caller included). Default: QUANTMATMUL_NUM_THREADS if set,
// else the CPUs this process may use: those it may run on (sched_getaffinity, else
// hardware_concurrency), no more than its cgroup's CPU quota allows (a container's CPU limit).
int get_num_threads();
void set_num_threads(int n);

// The CPUs the CPU quota of this process's cgroup allows, rounded up: the smallest quota over its
// cgroup and their ancestors, cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us / cpu.cfs_period_us);
// 0 where none is set or none can be read. Every path is read below root ("" for this machine;
// the tests pass a directory that holds a proc/self/cgroup and a sys/fs/cgroup of their own).
int cgroup_cpu_quota(const std::string& root);

// Whether the pool's waiting threads spin before they sleep: only while it has no more threads
// than the CPUs it may use (oversubscribed, a spinning thread holds a CPU that work waits for).
bool pool_spins();

// Runs task(i) for i in [0, count) on up to get_num_threads() threads (the calling thread takes part)
// and returns when all are done. Tasks are handed out dynamically, so uneven tasks balance. Safe to
// call from several threads at once: concurrent calls are serialized on the pool, and a call made
// from inside a task runs inline. The caller waits for the tasks, not for helpers that are not
// awake yet. min_per_thread: wake only as many helpers as leave each thread at least that many
// tasks (a small job is quicker done by fewer threads than by waking more).
void parallel_for(int64_t count, const std::function<void(int64_t)>& task, int64_t min_per_thread = 1);

// Elements [0, count) in tasks of `task` consecutive elements: range(t, i0, i1) for task t, elements
// [i0, i1), on the pool (parallel_for's min_per_thread as given).
template <class Range>
void parallel_ranges(int64_t count, int64_t task, int64_t min_per_thread, Range&& range) {
  const int64_t tasks = (count + task - 1) / task;
  parallel_for(
      tasks, [&](int64_t t) { range(t, t * task, t * task + task < count ? t * task + task : count); }, min_per_thread);
}

// While alive, up to threads - 1 of the pool's helpers stay awake for this thread's parallel_for
// calls: woken when it begins, each spins for the next job (up to a millisecond at a time)
// instead of sleeping. For a call made of serial steps and jobs (A prepared by the caller, then
// the products; or two jobs in a row): one wake-up, overlapped with the first serial step, instead
// of one after each step. Ends with the call: no helper spins between calls. None begins where the
// pool does not spin (pool_spins()).
class ParallelRegion {
 public:
  explicit ParallelRegion(int threads);
  ~ParallelRegion();
  ParallelRegion(const ParallelRegion&) = delete;
  ParallelRegion& operator=(const ParallelRegion&) = delete;

 private:
  bool begun_;
};

// The tasks per thread worth waking a helper for, where one task takes about task_ns nanoseconds
// on one thread: enough for about 20 microseconds each (a wake-up costs a few, and more on virtual
// machines).
inline int64_t tasks_worth_a_thread(double task_ns) {
  const double tasks = 20000.0 / (task_ns > 1.0 ? task_ns : 1.0);
  return tasks < 1.0 ? 1 : static_cast<int64_t>(tasks);
}

}  // namespace qmm
