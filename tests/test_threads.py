"""The default thread count (CPU affinity, a cgroup's CPU quota) and when the pool's threads spin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import quantmatmul as qm
from quantmatmul import _core


def _tree(root, cgroup_lines, files):
    """A fake proc/self/cgroup and sys/fs/cgroup below root: files maps paths to their text."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text("".join(line + "\n" for line in cgroup_lines))
    for path, text in files.items():
        target = root / "sys" / "fs" / "cgroup" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")
    return str(root)


V1_LINES = ["12:pids:/docker/abc", "4:cpu,cpuacct:/docker/abc", "3:memory:/docker/abc", "1:name=systemd:/docker/abc"]

# (what /proc/self/cgroup says, the files below sys/fs/cgroup, the CPUs the quota allows)
TREES = {
    # cgroup v2 in a container's namespace: its own cgroup is the mount's root.
    "v2 namespaced, 2 CPUs": (["0::/"], {"cpu.max": "200000 100000"}, 2),
    "v2 no quota": (["0::/"], {"cpu.max": "max 100000"}, 0),
    "v2 1.5 CPUs rounds up": (["0::/"], {"cpu.max": "150000 100000"}, 2),
    "v2 a tenth of a CPU is 1": (["0::/"], {"cpu.max": "10000 100000"}, 1),
    # v2 without a namespace: the cgroup's directory below the mount; an ancestor's quota binds it.
    "v2 ancestor's quota": (
        ["0::/kubepods/pod1/ctr"],
        {"kubepods/pod1/cpu.max": "300000 100000", "kubepods/pod1/ctr/cpu.max": "max 100000"},
        3,
    ),
    "v2 the smaller of two": (["0::/a/b"], {"a/cpu.max": "800000 100000", "a/b/cpu.max": "400000 100000"}, 4),
    "v2 no file": (["0::/"], {}, 0),
    "v2 garbage": (["0::/"], {"cpu.max": "lots"}, 0),
    "v2 quota with trailing text": (["0::/"], {"cpu.max": "200000x 100000"}, 0),
    "v2 period zero": (["0::/"], {"cpu.max": "200000 0"}, 0),
    "v2 one word": (["0::/"], {"cpu.max": "200000"}, 0),
    "v2 tabs and spaces": (["0::/"], {"cpu.max": "  200000\t 100000 "}, 2),
    # cgroup v1: the cpu controller's hierarchy, mounted at the container's cgroup (docker) ...
    "v1 namespaced mount": (
        V1_LINES,
        {"cpu,cpuacct/cpu.cfs_quota_us": "300000", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
        3,
    ),
    # ... or the whole hierarchy, the process's cgroup below it; "cpu" alone as the mount's name.
    "v1 full hierarchy": (
        V1_LINES,
        {"cpu/docker/abc/cpu.cfs_quota_us": "250000", "cpu/docker/abc/cpu.cfs_period_us": "100000"},
        3,
    ),
    "v1 no quota": (V1_LINES, {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0),
    "v1 other controllers only": (
        ["3:memory:/x", "2:cpuset:/x"],
        {"cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000"},
        0,
    ),
    "v1 garbage": (V1_LINES, {"cpu,cpuacct/cpu.cfs_quota_us": "-", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0),
    "v1 cpuacct is not cpu": (
        ["4:cpuacct:/"],
        {"cpuacct/cpu.cfs_quota_us": "100000", "cpuacct/cpu.cfs_period_us": "100000"},
        0,
    ),
    "v1 cpu last in the list": (
        ["4:cpuacct,cpu:/"],
        {"cpuacct,cpu/cpu.cfs_quota_us": "200000", "cpuacct,cpu/cpu.cfs_period_us": "100000"},
        2,
    ),
    "no proc file": (None, {}, 0),
}


@pytest.mark.parametrize("name", TREES)
def test_cgroup_cpu_quota_read_from_v1_and_v2_trees(tmp_path, name):
    lines, files, cpus = TREES[name]
    root = _tree(tmp_path, lines, files) if lines is not None else str(tmp_path)
    assert _core.cgroup_cpu_quota(root) == cpus


def test_this_machines_quota_in_cpu_info():
    quota = qm.cpu_info()["cpu_quota"]
    assert quota is None or quota >= 1
    assert (quota or 0) == _core.cgroup_cpu_quota()


def _default_threads(preexec=None, **env):
    environment = {k: v for k, v in os.environ.items() if k != "QUANTMATMUL_NUM_THREADS"} | env
    done = subprocess.run(
        [sys.executable, "-c", "import quantmatmul as q; print(q.get_num_threads())"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        preexec_fn=preexec,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_default_threads_are_the_cpus_this_process_may_use():
    cpus = len(os.sched_getaffinity(0))
    quota = _core.cgroup_cpu_quota()
    assert _default_threads() == (min(cpus, quota) if quota else cpus)
    # Pinned to one CPU (taskset): one thread; the environment variable still decides.
    one = min(os.sched_getaffinity(0))
    assert _default_threads(preexec=lambda: os.sched_setaffinity(0, {one})) == 1
    assert _default_threads(preexec=lambda: os.sched_setaffinity(0, {one}), QUANTMATMUL_NUM_THREADS="3") == 3


def test_the_pool_spins_only_with_no_more_threads_than_cpus():
    cpus = len(os.sched_getaffinity(0))
    quota = _core.cgroup_cpu_quota()
    usable = min(cpus, quota) if quota else cpus
    before = qm.get_num_threads()
    try:
        qm.set_num_threads(usable)
        assert _core.pool_spins()
        qm.set_num_threads(1)
        assert _core.pool_spins()
        qm.set_num_threads(usable + 1)
        assert not _core.pool_spins()
    finally:
        qm.set_num_threads(before)


FORK_SCRIPT = """
import os, warnings
import numpy as np
import quantmatmul as qm
qm.set_num_threads(2)
rng = np.random.default_rng(0)
w = qm.MatMulNBits.from_float(rng.standard_normal((2048, 2048), dtype=np.float32), bits=4, block_size=32,
                              accuracy_level=4)
A = rng.standard_normal((64, 2048), dtype=np.float32)
y = w(A)  # the parent's pool has its helper now
read, write = os.pipe()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12: fork() of a multi-threaded process
    pid = os.fork()
if pid == 0:
    same = np.array_equal(w(A), y)
    os.write(write, f"{len(os.listdir('/proc/self/task'))} {same}".encode())
    os._exit(0)
os.close(write)
print(os.read(read, 100).decode())
os.waitpid(pid, 0)
"""


def test_a_forked_child_gets_a_pool_of_its_own():
    # The parent's workers do not exist in a child made by fork (multiprocessing's default on
    # Linux): without a pool of its own, every job there would run on its calling thread alone.
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    threads, same = done.stdout.split()
    assert same == "True"
    assert int(threads) >= 2  # the child's caller and the helper its product woke


def test_a_parallel_region_keeps_results_and_leaves_no_thread_spinning():
    """_core.ParallelRegion (the session's run holds one): products inside give the same bits; regions nest,
    end on an exception, and run beside another thread's products; a helper spins only briefly after each
    job (up to a millisecond), so neither an idle region nor its end leaves a core busy."""
    import threading
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (96, 512), np.uint8)
    b = rng.integers(-128, 128, (512, 256), np.int8)
    held = qm.QLinearMatMul(b, np.float32(0.01), np.int8(0))
    want = held(a, np.float32(0.02), np.uint8(3), np.float32(0.5), np.uint8(7))

    def run():
        return held(a, np.float32(0.02), np.uint8(3), np.float32(0.5), np.uint8(7))

    def idle_cpu(seconds=0.2):
        start = time.process_time()
        time.sleep(seconds)
        return time.process_time() - start

    with _core.ParallelRegion():
        assert np.array_equal(run(), want)
        with _core.ParallelRegion():
            assert np.array_equal(run(), want)
        assert idle_cpu() < 0.05
    assert idle_cpu() < 0.05
    with pytest.raises(RuntimeError, match="raised inside"):
        with _core.ParallelRegion():
            run()
            raise RuntimeError("raised inside")
    results = []
    other = threading.Thread(target=lambda: results.extend(run() for _ in range(20)))
    other.start()
    with _core.ParallelRegion():
        for _ in range(20):
            assert np.array_equal(run(), want)
    other.join()
    assert len(results) == 20 and all(np.array_equal(r, want) for r in results)
    assert idle_cpu() < 0.05
