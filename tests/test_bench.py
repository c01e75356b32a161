"""test_bench.py: `quantmatmul bench` runs end to end (small shapes) and reports what it measured, under labels that name the shapes run."""

import contextlib
import io
import json
import re

import pytest

import quantmatmul.bench as bench
import quantmatmul.cli as cli


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `quantmatmul bench --quick` run: its JSON report and what it printed."""
    out = tmp_path_factory.mktemp("bench") / "report.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["bench", "--quick", "--repeat", "1", "--threads", "1", "--json", str(out)]) == 0
    return json.loads(out.read_text()), printed.getvalue()


def _shape_in(label):
    """(M, K, N) as a label states it, read independently of bench.shape_label."""
    cube = re.search(r"\b(\d+)\^3\b", label)
    if cube:
        return (int(cube[1]),) * 3
    found = re.search(r"\bM=(\d+) K=(\d+) N=(\d+)\b", label)
    assert found, f"no shape in label {label!r}"
    return tuple(int(x) for x in found.groups())


def test_bench_quick_report(quick_run):
    report, printed = quick_run
    assert report["threads"] == 1 and report["peak_gops"] > 0
    rows = {r["case"]: r for r in report["results"]}
    assert set(rows) == {c.quick_case().name for c in bench.CASES}
    for row in rows.values():
        assert row["median_ms"]["quantmatmul"] > 0
    # ORT runs u8 x u8 exactly (int16 pairs): our bits must equal its bits there
    assert rows["u8u8 inputs 256^3"]["identical_to_onnxruntime"] is True
    assert all(r["difference_explained"] is not False for r in rows.values())
    assert "onnxruntime" not in rows["e4m3 256^3"]["median_ms"]  # ORT has no float8 QLinearMatMul
    assert rows["e4m3 256^3"]["baseline"] == "u8s8 256^3" in rows  # compared at the same shape
    nbits = {r["case"]: r for r in report["matmul_nbits"]}
    assert set(nbits) == {c.name for c in bench.NBITS_QUICK}
    assert "onnxruntime level 4" in nbits["4-bit b32 level 0 M=1 K=1024 N=1024"]["median_ms"]
    assert "onnxruntime level 4" not in nbits["3-bit b32 level 0 M=16 K=512 N=512"]["median_ms"]  # ORT: no 3-bit
    quantize = {r["case"]: r for r in report["quantize"]}
    assert set(quantize) == {c.name for c in bench.QUANTIZE_QUICK}
    for row in quantize.values():
        assert all(row["median_ms"][m] > 0 for m in bench.QUANTIZE_METHODS)
        assert row.get("rtn_identical_to_onnxruntime", True) is True  # absent without onnxruntime
    cold = report["matmul_nbits_cold"]
    assert cold["memory_bandwidth_gbps"] > 0 and cold["levels"] == [0, 4]
    assert all(cold["gbps"][f"quantmatmul level {level}"] > 0 for level in (0, 4))
    assert {"onnxruntime level 0", "onnxruntime level 4"} <= set(cold["gbps"])
    assert "u8s8 M=64 K=1024 N=1024" in printed and "GOP/s" in printed
    assert "x our u8s8 256^3" in printed  # s8u8 and e4m3 against u8s8 at their own shape


def test_bench_quick_labels_state_the_shapes_run(quick_run):
    report, printed = quick_run
    runs = report["results"] + report["matmul_nbits"]
    assert any((r["M"], r["K"], r["N"]) != (c.M, c.K, c.N) for r, c in zip(report["results"], bench.CASES))
    for row in runs:
        assert _shape_in(row["case"]) == (row["M"], row["K"], row["N"]), row["case"]
        assert any(line.startswith(row["case"] + " ") for line in printed.splitlines()), row["case"]
    full_labels = {c.name for c in bench.CASES if c.quick_case() is not c}
    assert not full_labels & {r["case"] for r in runs}
    assert not any(label in printed for label in full_labels)


def test_labels_follow_the_shape():
    for case in bench.CASES + bench.NBITS_CASES:
        assert _shape_in(case.name) == (case.M, case.K, case.N)
    for case in bench.CASES:
        small = case.quick_case()
        assert _shape_in(small.name) == (small.M, small.K, small.N)
        assert small.name.split(" ")[0] == case.name.split(" ")[0]  # same operand types
        if case.baseline_name:
            assert small.baseline_name in {c.quick_case().name for c in bench.CASES}


def _report(peers_by_case):
    results = [
        dict(case=f"case {i}", M=64, K=256, N=256, gops={p: 10.0 + i for p in peers})
        for i, peers in enumerate(peers_by_case)
    ]
    results.append(dict(case="tiny", M=1, K=16, N=16, gops={"quantmatmul": 1.0, "onednn": 1.0}))  # not charted
    return dict(results=results, peak_gops=100.0, threads=1, cpu="test CPU", isa="test")


def test_chart_lists_only_the_peers_that_ran():
    names, series = bench.chart_data(_report([("quantmatmul", "onnxruntime"), ("quantmatmul",)]))
    assert names == ["case 0", "case 1"]
    assert list(series) == ["quantmatmul", "onnxruntime"]  # no torch: no oneDNN
    assert series["onnxruntime"] == [10.0, 0.0]
    _, series = bench.chart_data(_report([("quantmatmul", "onnxruntime", "onednn")]))
    assert list(series) == ["quantmatmul", "onnxruntime", "onednn"]


def test_chart_legend_without_onednn(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    fig = bench.plot(_report([("quantmatmul", "onnxruntime"), ("quantmatmul", "onnxruntime")]), str(path))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sorted(legend) == ["measured kernel peak", "onnxruntime", "quantmatmul"]
    assert path.stat().st_size > 0


def test_bench_only_quantize(tmp_path):
    out = tmp_path / "report.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert (
            cli.main(["bench", "--quick", "--repeat", "1", "--threads", "1", "--only", "quantize", "--json", str(out)])
            == 0
        )
    report = json.loads(out.read_text())
    assert "results" not in report and "matmul_nbits" not in report
    assert [r["case"] for r in report["quantize"]] == [c.name for c in bench.QUANTIZE_QUICK]
    assert report["threads"] == 1 and report["cpu"]
    assert "quantize 4-bit b32 K=256 N=512" in printed.getvalue()
