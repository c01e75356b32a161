"""conftest.py: reports, at the end of every run, which kernel paths the suite exercised on this CPU."""


def pytest_terminal_summary(terminalreporter):
    import sys

    native = sys.modules.get("test_native")
    if native is None:
        return
    import quantmatmul

    info = quantmatmul.cpu_info()
    terminalreporter.write_line(
        f"quantmatmul kernel paths tested: {', '.join(sorted(native.TESTED_ISAS)) or 'none'} "
        f"(available here: {', '.join(info['available_isas'])}; CPU: {info['features']['brand']})")
