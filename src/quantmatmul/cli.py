"""cli.py: the `quantmatmul` command: `quantmatmul demo` runs each source document's worked example and quantizes all-MiniLM-L6-v2 end to end, `quantmatmul bench` times it against the peers."""

from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

from . import orion
from .qlinear import qlinear_matmul


def _peers():
    """The peer runner, or None when onnx/onnxruntime are not installed (pip install quantmatmul[peers])."""
    try:
        from . import peers
    except ImportError:
        return None
    return peers


def _show(name, value):
    text = np.array2string(np.asarray(value), prefix=" " * (len(name) + 4))
    print(f"  {name} = {text}  ({np.asarray(value).dtype}, shape {np.shape(value)})")


def _compare_with_onnxruntime(args, ours):
    peers = _peers()
    if peers is None:
        print("  ONNX Runtime: not installed (pip install 'quantmatmul[peers]' to compare)")
        return True
    try:
        theirs = peers.run_onnxruntime(*args)
    except Exception as error:  # ORT rejects the type combination: say so in its own words
        reason = str(error).strip().splitlines()[0]
        print(f"  ONNX Runtime: cannot run this case ({reason[:110]}...)")
        return True
    same = (
        theirs.dtype == ours.dtype
        and theirs.shape == ours.shape
        and np.array_equal(theirs.view(np.uint8), ours.view(np.uint8))
    )
    print(f"  ONNX Runtime: {'bit-identical' if same else 'DIFFERENT: ' + str(theirs.tolist())}")
    return same


def _qlinear_example(title, args, expected, source="documented result"):
    print(f"\n== {title}")
    for name, value in zip(
        ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"), args
    ):
        _show(name, value)
    y = qlinear_matmul(*args)
    _show("y", y)
    ok = expected is None or np.array_equal(y.astype(np.float64), np.asarray(expected, np.float64))
    if expected is not None:
        print(f"  {source}: {np.asarray(expected).tolist()} -> {'matches' if ok else 'MISMATCH'}")
    return _compare_with_onnxruntime(args, y) and ok


def demo() -> int:
    print("quantmatmul demo: the worked examples of the source documents, then all-MiniLM-L6-v2 quantized end to end")
    s = lambda v: np.array([v], np.float32)
    u = lambda v: np.array([v], np.uint8)
    a = np.array([[208, 236, 0, 238], [3, 214, 255, 29]], np.uint8)
    b = np.array([[152, 51, 244], [60, 26, 255], [0, 127, 246], [127, 254, 247]], np.uint8)
    expected = np.array([[168, 115, 255], [1, 66, 151]], np.uint8)
    ok = _qlinear_example(
        "ONNX QLinearMatMul, 2-D example (opsets 10 and 21)",
        (a, s(0.0066), u(113), b, s(0.00705), u(114), s(0.0107), u(118)),
        expected,
    )
    ok &= _qlinear_example(
        "ONNX QLinearMatMul, 3-D example",
        (np.stack([a, a]), s(0.0066), u(113), np.stack([b, b]), s(0.00705), u(114), s(0.0107), u(118)),
        np.stack([expected, expected]),
    )

    e4 = ml_dtypes.float8_e4m3fn
    fa = np.array([[1.5, -2.0, 0.25], [3.0, 0.5, -1.0]], e4)
    fb = np.array([[2.0, 1.0], [0.5, -0.75], [4.0, 1.0]], e4)
    # dequantized: a * 0.5 and b * 2; (a@b) * 1.0 / 0.25 -> e4m3fn, round to nearest even, saturate
    ok &= _qlinear_example(
        "Float8 QLinearMatMul (opset 21 types; no runtime implements it)",
        (fa, s(0.5), np.zeros(1, e4), fb, s(2.0), np.zeros(1, e4), s(0.25), np.zeros(1, e4)),
        (fa.astype(np.float32) @ fb.astype(np.float32) / 0.25).astype(e4),
        source="float32 matmul of the dequantized values, cast to e4m3fn",
    )

    print("\n== Orion tensor.qlinear_matmul, documented example (FP16x16 fixed point)")
    oa = np.array([[3, 4, 5], [2, 4, 3]], np.int8)
    ob = np.array([[4], [8], [4]], np.int8)
    _show("a", oa)
    _show("b", ob)
    print("  a_scale=2.0 a_zero_point=1.0 b_scale=0.25 b_zero_point=0.0 y_scale=6.0 y_zero_point=10.0")
    y = orion.qlinear_matmul(oa, 2.0, 1.0, ob, 0.25, 0.0, 6.0, 10.0, fixed_point="FP16x16")
    _show("y", y)
    orion_ok = y.ravel().tolist() == [14, 13]
    print(f"  documented result: [14, 13] -> {'matches' if orion_ok else 'MISMATCH'}")
    ok &= orion_ok

    from . import _demo_minilm, _demo_nbits

    ok &= _demo_nbits.run()
    ok &= _demo_minilm.run()
    print("\nall examples reproduced" if ok else "\nSOME EXAMPLES DID NOT REPRODUCE")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="quantmatmul", description=__doc__.split(": ", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo",
        help="run each source document's worked example and compare with ONNX Runtime; "
        "quantize all-MiniLM-L6-v2 with quantmatmul's and ONNX Runtime's quantizers",
    )
    bench = sub.add_parser("bench", help="time quantmatmul against ONNX Runtime and oneDNN (torch) on identical inputs")
    bench.add_argument("--threads", type=int, default=None, help="threads for every library (default: all usable CPUs)")
    bench.add_argument("--repeat", type=int, default=15, help="interleaved rounds; medians are reported")
    bench.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke run")
    bench.add_argument("--json", metavar="PATH", help="write the report as JSON ('-': to standard output)")
    bench.add_argument("--plot", metavar="PNG", help="write a bar chart (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    if args.command == "bench":
        from . import bench as bench_module

        return bench_module.main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
