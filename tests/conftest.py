"""conftest.py: the per-kernel-path fixture, and a report, at the end of every run, of which kernel paths the suite exercised on this CPU and which documented peer deviations hold."""

import pytest
import quantmatmul

import peer_deviations

TESTED_ISAS: set[str] = set()


@pytest.fixture(params=quantmatmul.available_isas())
def isa(request):
    """Runs the test once per kernel path this machine supports; restores the default afterwards."""
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
    terminalreporter.write_line(
        f"quantmatmul kernel paths tested: {', '.join(sorted(TESTED_ISAS))} "
        f"(available here: {', '.join(info['available_isas'])}; CPU: {info['features']['brand']})")
