"""conftest.py: the per-kernel-level fixture, and a report, at the end of every run, of which kernel levels the suite exercised on this CPU (natively or emulated) and which documented peer deviations hold; kernel_entry, to run a body under one family's entry."""

import contextlib

import pytest
import quantmatmul

import peer_deviations

TESTED_ISAS: set[str] = set()


def kernel_levels() -> list[str]:
    """Every level this machine runs natively, then the emulated levels it lacks natively (AVX-512
    over SIMDe, AMX over the tile emulation): together, every kernel table of this build."""
    native = quantmatmul.available_isas()
    return native + [e for e in quantmatmul.emulated_isas() if e.removesuffix("-emulated") not in native]


@contextlib.contextmanager
def kernel_entry(family, level, hidden=()):
    """Runs the body under a level with some CPU features hidden from selection (_core.hide_features),
    yielding the name of the entry `family` ("qgemm", "nbits", "float8") runs there; restores both."""
    before = quantmatmul.cpu_info()["isa"]
    try:
        quantmatmul.set_isa(level)
        quantmatmul._core.hide_features(list(hidden))
        yield quantmatmul.cpu_info()["kernels"][family]
    finally:
        quantmatmul._core.hide_features([])
        quantmatmul.set_isa(before)


@pytest.fixture(params=kernel_levels())
def isa(request):
    """Runs the test once per kernel level (native or emulated); restores the previous one afterwards."""
    before = quantmatmul.cpu_info()["isa"]
    quantmatmul.set_isa(request.param)
    assert quantmatmul.cpu_info()["isa"] == request.param
    TESTED_ISAS.add(request.param)
    yield request.param
    quantmatmul.set_isa(before)


def pytest_terminal_summary(terminalreporter):
    for line in peer_deviations.summary_lines():  # tests/peer_deviations.py
        terminalreporter.write_line(line)
    if not TESTED_ISAS:
        return
    info = quantmatmul.cpu_info()
    native = sorted(i for i in TESTED_ISAS if not i.endswith("-emulated"))
    emulated = sorted(i.removesuffix("-emulated") for i in TESTED_ISAS if i.endswith("-emulated"))
    terminalreporter.write_line(
        f"quantmatmul kernel levels tested: natively {', '.join(native)}; emulated {', '.join(emulated) or 'none'} "
        f"(native here: {', '.join(info['available_isas'])}; CPU: {info['features']['brand']})")
    terminalreporter.write_line("quantmatmul kernel entries: " + "; ".join(info["entries"]))
