"""test_bench.py: `quantmatmul bench` runs end to end (small shapes) and reports what it measured."""

import json

import quantmatmul.bench as bench
import quantmatmul.cli as cli


def test_bench_quick_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert cli.main(["bench", "--quick", "--repeat", "1", "--threads", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["threads"] == 1 and report["peak_gops"] > 0
    rows = {r["case"]: r for r in report["results"]}
    assert set(rows) == {c.name for c in bench.CASES}
    for row in rows.values():
        assert row["median_ms"]["quantmatmul"] > 0
    # ORT runs u8 x u8 exactly (int16 pairs): our bits must equal its bits there
    assert rows["u8u8 inputs 1024^3"]["identical_to_onnxruntime"] is True
    assert all(r["difference_explained"] is not False for r in rows.values())
    assert "onnxruntime" not in rows["e4m3 1024^3"]["median_ms"]  # ORT has no float8 QLinearMatMul
    nbits = {r["case"]: r for r in report["matmul_nbits"]}
    assert set(nbits) == {c.name for c in bench.NBITS_QUICK}
    assert "onnxruntime level 4" in nbits["4-bit b32 level 0 M=1 K=1024 N=1024"]["median_ms"]
    assert "onnxruntime level 4" not in nbits["3-bit b32 level 0 M=16 K=512 N=512"]["median_ms"]  # ORT: no 3-bit
    cold = report["matmul_nbits_cold"]
    assert cold["memory_bandwidth_gbps"] > 0 and cold["gbps"]["quantmatmul"] > 0
    printed = capsys.readouterr().out
    assert "u8s8 M=128 K=N=4096" in printed and "GOP/s" in printed
