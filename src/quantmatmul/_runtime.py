"""_runtime.py: the compiled core's run-time settings: CPU features, the kernel entries in use (QUANTMATMUL_ISA) and threads."""

from __future__ import annotations

import os
import warnings

from . import _core

__all__ = ["cpu_info", "set_num_threads", "get_num_threads", "available_isas", "emulated_isas", "set_isa"]

ISAS = ("portable", "avx2", "avx512_vnni", "amx")
EMULATED = tuple(f"{isa}-emulated" for isa in ISAS[2:])


def cpu_info() -> dict:
    """The detected CPU features, the kernel levels this machine can run, and the entry each kernel
    family uses now.

    ``isa`` is the level last selected (``set_isa`` / QUANTMATMUL_ISA; by default the best);
    ``kernels`` names the entry of each family at that level: ``qgemm`` (QLinearMatMul's int8 GEMM,
    with ``qgemm_layout``, its packed layout), ``nbits`` (MatMulNBits) and ``float8`` (the float8
    path). A family without an entry at the level runs its best one below. ``entries`` lists every
    entry this build has, and ``self_test`` what failed the known-answer test a native entry runs
    before its first use (such an entry is never used). ``num_threads`` is what the kernels use
    now; ``cpu_quota`` the CPUs a cgroup CPU quota allows this process (a container's CPU limit:
    the default thread count is no higher), or None without one.

    >>> info = cpu_info(); info["isa"] in info["available_isas"]
    True
    """
    return {
        "features": _core.cpu_features(),
        "available_isas": available_isas(),
        "emulated_isas": emulated_isas(),
        "best_isa": _core.best_isa(),
        "isa": _core.active_isa(),
        "kernels": _core.kernels(),
        "entries": _core.kernel_entries(),
        "self_test": _core.self_test_report() or None,
        "requested_isa": os.environ.get("QUANTMATMUL_ISA"),
        "num_threads": get_num_threads(),
        "cpu_quota": _core.cgroup_cpu_quota() or None,
    }


def available_isas() -> list[str]:
    """Kernel levels this machine runs natively and this build has, lowest first."""
    return [isa for isa in ISAS if _core.isa_available(isa)]


def emulated_isas() -> list[str]:
    """Levels whose kernels this build also has as emulated entries that run here (for tests):
    AVX-512 over SIMDe, AMX over the tile emulation, both on AVX2."""
    return [isa for isa in EMULATED if _core.isa_available(isa)]


def set_isa(isa: str) -> None:
    """Select the kernels of a level no higher than the best this machine has (as QUANTMATMUL_ISA
    does), or, with a name from ``emulated_isas()``, that level's emulated kernels."""
    if isa not in ISAS + EMULATED:
        raise ValueError(f"set_isa: isa must be one of {', '.join(ISAS + EMULATED)}, got {isa!r}")
    if not _core.set_isa(isa):
        here = available_isas() + emulated_isas()
        raise ValueError(f"set_isa: {isa} is not available here; available: {', '.join(here)}")


def get_num_threads() -> int:
    """Threads the kernels use: QUANTMATMUL_NUM_THREADS, else the CPUs this process may use (its
    CPU affinity, no more than its cgroup's CPU quota allows), unless set_num_threads set them."""
    return _core.get_num_threads()


def set_num_threads(n: int) -> None:
    """Set the number of threads the kernels use (n >= 1)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: n must be a positive integer, got {n!r}")
    _core.set_num_threads(n)


def _apply_environment() -> None:
    """QUANTMATMUL_ISA selects a level; a level this machine lacks falls back to the best it has.
    QUANTMATMUL_NUM_THREADS, where set and not empty, must be a positive integer (the pool reads it when first
    used). A native entry that failed its self-test is reported once."""
    threads = os.environ.get("QUANTMATMUL_NUM_THREADS")
    if threads and not (threads.strip().isdigit() and int(threads) > 0):  # empty: unset, as QUANTMATMUL_ISA
        raise ValueError(f"QUANTMATMUL_NUM_THREADS={threads!r} is not a positive integer")
    requested = os.environ.get("QUANTMATMUL_ISA")
    if requested and requested not in ISAS + EMULATED:
        raise ValueError(f"QUANTMATMUL_ISA={requested!r} is not one of {', '.join(ISAS + EMULATED)}")
    # Select the entries now (self-testing the native ones), not at the first product; a requested
    # level first, so that the levels above it are never run.
    if not (requested and _core.set_isa(requested)):
        _core.active_isa()
    report = _core.self_test_report()
    if report:
        warnings.warn(f"quantmatmul: kernels not used, their self-test failed: {report}", RuntimeWarning, stacklevel=3)


_apply_environment()
