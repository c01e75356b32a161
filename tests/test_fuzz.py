"""The differential fuzzer (tests/fuzz.py, `make fuzz`) runs and passes a few cases of each operator."""

import fuzz


def test_the_fuzzer_runs_cases_of_both_operators(capsys):
    assert fuzz.main(["--cases", "5", "--seed", "1400", "--threads", "3"]) == 0  # one of each family
    out = capsys.readouterr().out
    assert "5 cases from seed 1400, 0 failed" in out
    assert "tables: portable" in out  # every table this machine runs is listed, the portable one first


def test_a_failing_case_is_reported_with_its_seed(monkeypatch, capsys):
    monkeypatch.setattr(fuzz.qlinear_oracle, "exact", lambda *args: fuzz.qlinear_oracle.onnxruntime(*args) ^ 1)
    monkeypatch.setattr(fuzz, "NUMERICS", {"exact": fuzz.qlinear_oracle.exact})
    assert fuzz.main(["--cases", "1", "--seed", "7", "--family", "qlinear"]) == 1
    assert "FAIL qlinear seed 7:" in capsys.readouterr().out
