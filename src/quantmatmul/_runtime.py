"""_runtime.py: the compiled core's run-time settings: CPU features, the kernel path (QUANTMATMUL_ISA) and threads."""

from __future__ import annotations

import os

from . import _core

__all__ = ["cpu_info", "set_num_threads", "get_num_threads", "available_isas", "set_isa"]

ISAS = ("portable", "avx2", "avx512_vnni", "amx")


def cpu_info() -> dict:
    """The detected CPU features, the paths this machine can run and the one in use.

    >>> info = cpu_info(); info["isa"] in info["available_isas"]
    True
    """
    return {
        "features": _core.cpu_features(),
        "available_isas": available_isas(),
        "best_isa": _core.best_isa(),
        "isa": _core.active_isa(),
        "requested_isa": os.environ.get("QUANTMATMUL_ISA"),
        "num_threads": get_num_threads(),
    }


def available_isas() -> list[str]:
    """Kernel paths this machine supports and this build has, lowest first."""
    best = ISAS.index(_core.best_isa())
    return list(ISAS[: best + 1])


def set_isa(isa: str) -> None:
    """Force a kernel path no higher than the best this machine has (as QUANTMATMUL_ISA does)."""
    if isa not in ISAS:
        raise ValueError(f"set_isa: isa must be one of {', '.join(ISAS)}, got {isa!r}")
    if isa not in available_isas():
        raise ValueError(f"set_isa: {isa} is not available here; available: {', '.join(available_isas())}")
    _core.set_isa(isa)


def get_num_threads() -> int:
    """Threads the kernels use (QUANTMATMUL_NUM_THREADS, else the CPUs this process may use)."""
    return _core.get_num_threads()


def set_num_threads(n: int) -> None:
    """Set the number of threads the kernels use (n >= 1)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: n must be a positive integer, got {n!r}")
    _core.set_num_threads(n)


def _apply_environment() -> None:
    """QUANTMATMUL_ISA forces a lower path; a path this machine lacks falls back to the best it has."""
    requested = os.environ.get("QUANTMATMUL_ISA")
    if not requested:
        return
    if requested not in ISAS:
        raise ValueError(f"QUANTMATMUL_ISA={requested!r} is not one of {', '.join(ISAS)}")
    if requested in available_isas():
        _core.set_isa(requested)


_apply_environment()
