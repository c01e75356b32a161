// thread_pool.cpp: the persistent worker pool behind parallel_for (condition variables, one job at a time).
#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>
#include <sys/stat.h>

#if defined(__linux__)
#include <sched.h>
#endif

namespace qmm {
namespace {

// The text of a small file ("" if unreadable), read with stdio: iostreams here crashed a process on
// the device host (a stack overflow inside ifstream's extraction at the pool's first use, with
// GCC 13's libstdc++ and numpy loaded; its cause not pinned down), and the cgroup files are a line or two.
std::string read_text(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    for (size_t n; text.size() < (1u << 20) && (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// The whitespace-separated words of `text`.
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0;;) {
    i = text.find_first_not_of(" \t\r\n", i);
    if (i == std::string::npos) return out;
    const size_t end = std::min(text.find_first_of(" \t\r\n", i), text.size());
    out.push_back(text.substr(i, end - i));
    i = end;
  }
}

// The decimal integer that is all of `word`, or `fallback`.
long long integer(const std::string& word, long long fallback) {
  if (word.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(word.c_str(), &end, 10);
  return errno == 0 && *end == '\0' ? v : fallback;
}

// The quota in the cgroup directory dir, as CPUs rounded up (0: none set, or unreadable): cgroup v2's
// cpu.max ("QUOTA PERIOD" or "max PERIOD"), v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
int quota_in(const std::string& dir, bool v2) {
  long long quota = -1, period = 0;
  if (v2) {
    const std::vector<std::string> max = words(read_text(dir + "/cpu.max"));
    if (max.size() < 2 || max[0] == "max") return 0;
    quota = integer(max[0], -1);
    period = integer(max[1], 0);
  } else {
    const std::vector<std::string> q = words(read_text(dir + "/cpu.cfs_quota_us"));
    const std::vector<std::string> p = words(read_text(dir + "/cpu.cfs_period_us"));
    if (q.empty() || p.empty()) return 0;
    quota = integer(q[0], -1);
    period = integer(p[0], 0);
  }
  if (quota <= 0 || period <= 0) return 0;
  const long long cpus = (quota + period - 1) / period;
  return cpus > (1 << 20) ? (1 << 20) : static_cast<int>(cpus);
}

bool is_dir(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// The smallest quota on the way from dir up to base (a cgroup's limit is its ancestors' too).
int smallest_quota(const std::string& base, std::string dir, bool v2) {
  int best = 0;
  for (;;) {
    const int q = quota_in(dir, v2);
    if (q > 0 && (best == 0 || q < best)) best = q;
    if (dir.size() <= base.size()) return best;
    dir.resize(dir.rfind('/'));
  }
}

int available_cpus() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  const int quota = cgroup_cpu_quota("");
  return quota > 0 && quota < n ? quota : n;
}

// QUANTMATMUL_NUM_THREADS if set, else the CPUs the process may use.
int default_threads(int cpus) {
  if (const char* env = std::getenv("QUANTMATMUL_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return cpus;
}

thread_local bool t_inside_task = false;

// How long the caller of a job spins for its helpers to finish before it sleeps (Pool::run): about
// what waking it would cost, so that waiting costs at most twice the better choice.
constexpr std::chrono::microseconds kDoneSpin{50};
// Inside a ParallelRegion: how long a helper spins for the region's next job before it sleeps. A
// caller's serial steps between jobs take some microseconds to some hundreds: in the ONNX session,
// the Python nodes between two products (all-MiniLM-L6-v2, one sentence of 16 tokens: a median 20-65
// us between products, and up to about 170 us from one pool job to the next across an attention's
// softmax). A helper asleep by then wakes after the next small job is over (tens of microseconds on a
// VM): with 100 us, the model's 384 x 384 products ran at their one-thread time (20.6 us, 12.4 us
// back to back).
constexpr std::chrono::microseconds kRegionSpin{1000};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins while waiting() holds, up to `limit` from now: the clock read every 16 pauses, not after each
// (a vDSO clock_gettime per pause was 8 % of the CPU samples of a MobileNet run in the session).
template <class Waiting>
void spin_while(Waiting waiting, std::chrono::microseconds limit) {
  if (limit.count() <= 0) return;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (!waiting()) return;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until) return;
  }
}

class Pool {
 public:
  static Pool& instance() {
    static const bool made = [] {
      const int cpus = available_cpus();
      current_ = new Pool(default_threads(cpus), cpus);  // never destroyed: workers may outlive static destruction
      pthread_atfork(nullptr, nullptr, after_fork_in_child);
      return true;
    }();
    (void)made;
    return *current_;
  }

  int threads() const { return threads_.load(); }
  void set_threads(int n) { threads_.store(n < 1 ? 1 : n); }
  // Whether waiting threads spin (kDoneSpin, kRegionSpin) before they sleep: only while the pool
  // has no more threads than the CPUs it may use. Oversubscribed, a spinning thread holds a CPU
  // that a thread with work is waiting for (2 CPUs, 16 threads: calls up to 1.9-2.7x slower).
  bool spins() const { return threads() <= cpus_; }

  // A ParallelRegion for want threads begins: up to want - 1 helpers are woken now, and they spin
  // for the region's jobs (each time up to kRegionSpin) instead of sleeping, until it ends.
  bool begin_region(int want) {
    want = std::min(want, threads());
    if (want <= 1 || t_inside_task || !spins()) return false;  // helpers that may not spin would only sleep again
    std::lock_guard<std::mutex> one_job(job_mutex_);  // between jobs: never closes a running one
    ensure_workers(want - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = nullptr;  // no job in this generation: the helpers woken spin for the next
      helpers_ = want - 1;
      ++regions_;
      region_helpers_.store(std::max(region_helpers_.load(), want - 1));
      generation_.fetch_add(1);
    }
    for (int i = 0; i < want - 1; ++i) slots_[i]->notify_one();
    return true;
  }
  void end_region() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--regions_ == 0) region_helpers_.store(0);  // spinning helpers go back to sleep
  }

  void run(int64_t count, const std::function<void(int64_t)>& task, int64_t min_per_thread) {
    const int64_t by_work = std::max<int64_t>(1, count / std::max<int64_t>(1, min_per_thread));
    int want = static_cast<int>(std::min<int64_t>(threads(), std::min(count, by_work)));
    // Helpers a region keeps spinning join a job in a microsecond or two, not the tens a sleeping one
    // takes to wake, for which min_per_thread is sized: up to them, a tenth of it is worth a thread.
    const int awake = region_helpers_.load(std::memory_order_relaxed);
    if (awake > 0 && want <= awake) {
      const int64_t by_awake = std::max<int64_t>(1, count / std::max<int64_t>(1, min_per_thread / 10));
      want = static_cast<int>(std::max<int64_t>(want, std::min<int64_t>({threads(), count, by_awake, awake + 1})));
    }
    if (want <= 1 || t_inside_task) {
      for (int64_t i = 0; i < count; ++i) task(i);
      return;
    }
    std::lock_guard<std::mutex> one_job(job_mutex_);  // concurrent callers take turns
    ensure_workers(want - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      count_ = count;
      next_.store(0);
      helpers_ = want - 1;
      generation_.fetch_add(1);
    }
    for (int i = 0; i < want - 1; ++i) slots_[i]->notify_one();  // only the helpers wanted
    work();  // the caller works too, until no task is left to take
    // Then it waits for the helpers still running a task, not for those not yet awake: a small job
    // is over without them (waking a thread takes tens of microseconds on a busy or virtual
    // machine, more than such a job), and one that wakes after the job is closed goes back to sleep.
    // Before sleeping on done_, it spins up to kDoneSpin for them: a helper that finishes a moment
    // later would otherwise have to wake it, tens of microseconds more per call (Zen 4 VM, 2
    // threads, QLinearMatMul 64x384x384 / 128x384x384: 95 / 104 -> 65 / 72 us; 1x4096x4096 181 ->
    // 166 us). This waits for the call's own work, never for the next call's: idle helpers sleep.
    spin_while([&] { return active_.load(std::memory_order_acquire) != 0; },
               spins() ? kDoneSpin : std::chrono::microseconds{0});
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    task_ = nullptr;  // closed: no helper joins it any more
  }

 private:
  Pool(int threads, int cpus) : threads_(threads), cpus_(cpus) {}

  // In a child process (fork), the parent's workers are gone (only the forking thread is copied)
  // and its locks may be held by threads that are gone too: the child gets a pool of its own, of
  // the parent's size, which starts its workers when it needs them (without it, every job of the
  // child ran on the caller alone). The parent's is left as it is, like the first never destroyed.
  static void after_fork_in_child() { current_ = new Pool(current_->threads(), current_->cpus_); }
  static inline Pool* current_ = nullptr;  // set once, then only in a forked child (one thread there)

  // A worker whose thread cannot start (std::system_error, raised to the caller) leaves no slot.
  void ensure_workers(int n) {
    slots_.reserve(static_cast<size_t>(n));
    while (static_cast<int>(slots_.size()) < n) {
      auto slot = std::make_unique<std::condition_variable>();
      std::thread(&Pool::worker_loop, this, static_cast<int>(slots_.size()), slot.get()).detach();
      slots_.push_back(std::move(slot));  // no reallocation: reserved
    }
  }

  void work() {
    t_inside_task = true;
    for (int64_t i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) (*task_)(i);
    t_inside_task = false;
  }

  void worker_loop(int index, std::condition_variable* wake) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake->wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        // Fewer helpers wanted, or no job (over, or a region's start): wait for the next, spinning
        // where a region keeps this helper awake.
        const bool join = index < helpers_ && task_ != nullptr;
        if (join) ++active_;
        else if (index >= region_helpers_.load()) continue;
        if (join) {
          lock.unlock();
          work();
          lock.lock();
          if (--active_ == 0) done_.notify_one();
        }
      }
      // In a region, spin for its next job (a new generation: the wait above then returns at once).
      spin_while(
          [&] {
            return index < region_helpers_.load(std::memory_order_relaxed) &&
                   generation_.load(std::memory_order_acquire) == seen;
          },
          spins() ? kRegionSpin : std::chrono::microseconds{0});
    }
  }

  std::atomic<int> threads_;
  const int cpus_;  // available_cpus() when the first pool was made
  std::mutex job_mutex_, mutex_;
  // Worker i sleeps on its own slots_[i], so a job wakes only the helpers it wants: on a 16-thread
  // pool, a job for 2 threads wakes one worker, not 15 that find nothing to do and queue on mutex_.
  std::vector<std::unique_ptr<std::condition_variable>> slots_;  // grown by the caller under job_mutex_
  std::condition_variable done_;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
  int helpers_ = 0;
  int regions_ = 0;  // ParallelRegions alive
  std::atomic<int> region_helpers_{0};  // helpers (by index) kept awake by them
  std::atomic<int> active_{0};  // helpers inside the current job's work()
  std::atomic<uint64_t> generation_{0};  // changed under mutex_; read without it by spinning helpers
};

}  // namespace

int cgroup_cpu_quota(const std::string& root) {
  const std::string self = read_text(root + "/proc/self/cgroup");
  int best = 0;
  for (size_t start = 0; start < self.size();) {
    const size_t eol = std::min(self.find('\n', start), self.size());
    const std::string line = self.substr(start, eol - start);
    start = eol + 1;
    // "ID:CONTROLLERS:PATH": v2's one line has ID 0 and no controllers; v1's have a line per hierarchy.
    const size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    while (!path.empty() && path.back() == '/') path.pop_back();
    const bool v2 = id == "0" && controllers.empty();
    std::vector<std::string> bases;
    if (v2) {
      bases.push_back(root + "/sys/fs/cgroup");
    } else {
      bool cpu = false;
      for (size_t i = 0; i <= controllers.size();) {
        const size_t comma = std::min(controllers.find(',', i), controllers.size());
        cpu = cpu || controllers.compare(i, comma - i, "cpu") == 0;
        i = comma + 1;
      }
      if (!cpu) continue;
      bases.push_back(root + "/sys/fs/cgroup/" + controllers);  // "cpu,cpuacct" where mounted so
      if (controllers != "cpu") bases.push_back(root + "/sys/fs/cgroup/cpu");
    }
    for (const std::string& base : bases) {
      // Mounted at the process's cgroup (a container's namespace): PATH is not below it.
      const std::string dir = is_dir(base + path) ? base + path : base;
      const int q = smallest_quota(base, dir, v2);
      if (q > 0 && (best == 0 || q < best)) best = q;
    }
  }
  return best;
}

int get_num_threads() { return Pool::instance().threads(); }
bool pool_spins() { return Pool::instance().spins(); }
void set_num_threads(int n) { Pool::instance().set_threads(n); }
void parallel_for(int64_t count, const std::function<void(int64_t)>& task, int64_t min_per_thread) {
  Pool::instance().run(count, task, min_per_thread);
}

ParallelRegion::ParallelRegion(int threads) : begun_(Pool::instance().begin_region(threads)) {}
ParallelRegion::~ParallelRegion() {
  if (begun_) Pool::instance().end_region();
}

}  // namespace qmm
