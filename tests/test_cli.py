"""test_cli.py: the `quantmatmul` command reproduces every worked example it shows."""

import quantmatmul.cli as cli


def test_demo_reproduces_every_example(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "DIFFERENT" not in out
    assert out.count("ONNX Runtime: bit-identical") == 2
    assert "all examples reproduced" in out
