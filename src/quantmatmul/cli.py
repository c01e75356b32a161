"""cli.py: the `quantmatmul` command: `quantmatmul demo` runs each source document's worked example and quantizes all-MiniLM-L6-v2 end to end, `quantmatmul bench` times it against the peers, `quantmatmul quantize | compare | run` work on ONNX models."""

from __future__ import annotations

import argparse
import os
import sys
import time

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
    bench.add_argument(
        "--only",
        choices=("qlinear", "nbits", "quantize"),
        default=None,
        help="one part only: QLinearMatMul, MatMulNBits, or the MatMulNBits weight quantizer",
    )
    _add_model_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    if args.command == "bench":
        from . import bench as bench_module

        return bench_module.main(args)
    if args.command in _MODEL_COMMANDS:
        return _model_command(args)
    return 2


# ---------------------------------------------------------------------------------------------------
# quantmatmul quantize | compare | run: ONNX models (quantmatmul.onnx, docs/onnx.md). Exit status 0: done
# (compare: every node agrees), 1: compare found differences, 2: bad input (the message, no traceback).

_MODEL_COMMANDS = ("quantize", "compare", "run")


def _add_model_commands(sub):
    q = sub.add_parser("quantize", help="quantize an ONNX model's MatMul/Gemm weights to MatMulNBits")
    q.add_argument("model", metavar="IN.onnx")
    q.add_argument("output", metavar="OUT.onnx")
    q.add_argument("--bits", type=int, default=4, help="2..8 (ONNX Runtime runs 2, 4, 8; default 4)")
    q.add_argument("--block-size", type=int, default=128, help="a power of two >= 16 (default 128)")
    q.add_argument(
        "--method", default="mse", help="rtn (ONNX Runtime's bytes), mse (default), hqq or gptq (needs --calibration)"
    )
    q.add_argument("--symmetric", action="store_true", help="no zero points")
    q.add_argument("--accuracy-level", type=int, default=None, metavar="N", help="MatMulNBits accuracy_level 0..4")
    q.add_argument("--exclude", nargs="+", default=[], metavar="NODE", help="node names to leave as they are")
    q.add_argument(
        "--calibration",
        metavar="FEEDS.npz",
        help="calibration inputs: one array per model input, a leading sample axis (needed by gptq, --bits-budget)",
    )
    q.add_argument(
        "--calibration-batch", type=int, default=8, metavar="B", help="samples per calibration run (default 8)"
    )
    q.add_argument(
        "--bits-budget", type=float, default=None, metavar="BITS", help="average bits per weight: raise nodes to 8"
    )
    q.add_argument("--sequential", action="store_true", help="calibrate group by group on quantized upstream nodes")
    q.add_argument("--desc-act", action="store_true", help="gptq: quantize rows by decreasing Hessian diagonal")
    c = sub.add_parser("compare", help="run a quantized model in ONNX Runtime and check each quantized node here")
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input (others: random)")
    c.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="a named dimension (default 1)")
    c.add_argument(
        "--numerics", default="exact", help="QLinearMatMul numerics: exact (default), onnxruntime, onnx-reference"
    )
    r = sub.add_parser("run", help="run an ONNX model on quantmatmul's kernels and write its outputs as .npy")
    r.add_argument("model", metavar="MODEL.onnx")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="every input of the model")
    r.add_argument("--output-dir", default=".", metavar="DIR", help="where OUTPUT.npy files go (default: .)")
    r.add_argument("--numerics", default="onnxruntime", help="QLinearMatMul numerics (default onnxruntime)")
    r.add_argument(
        "--no-fuse-qdq",
        dest="fuse_qdq",
        action="store_false",
        help="run QDQ MatMul / Gemm groups as written (a float MatMul or Gemm between DequantizeLinear and "
        "QuantizeLinear) rather than as one QLinearMatMul / QGemm, as ONNX Runtime's optimizer runs them",
    )
    r.add_argument(
        "--no-tabulate",
        dest="tabulate",
        action="store_false",
        help="run element-wise groups on one 8-bit tensor (an erf-GELU on codes) node by node rather than as "
        "one lookup table of their 256 codes (the same outputs)",
    )


def _model_command(args) -> int:
    try:
        from . import onnx as qonnx

        return {"quantize": _quantize, "compare": _compare, "run": _run}[args.command](args, qonnx)
    except (ValueError, TypeError, OSError, ImportError) as error:
        print(f"quantmatmul: error: {error}", file=sys.stderr)
        return 2


def _progress(what):
    def report(done, total, name, phase=None):
        print(f"[{done + 1}/{total}] {phase or what} {name or '(unnamed node)'}", file=sys.stderr, flush=True)

    return report


def _pairs(command, option, items, convert):
    """NAME=VALUE arguments as a dict, each value through convert."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{command}: {option} expects NAME=VALUE, got {item!r}")
        out[name] = convert(name, value)
    return out


def _npy(command):
    def load(name, path):
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:  # EOFError: an empty file
            raise ValueError(f"{command}: cannot read input {name!r} from {path!r}: {error}") from None

    return load


def _size(name, value):
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"compare: --dim {name} expects an integer size, got {value!r}") from None


def _calibration_feeds(path, batch, model_path):
    """(FEEDS.npz as a list of feeds, samples): each array's leading axis is cut into batches of `batch` samples (an
    array with one more dimension than its input declares: one sample per feed, its leading axis dropped)."""
    import onnx

    from .onnx._common import graph_inputs

    if isinstance(batch, bool) or batch < 1:
        raise ValueError(f"quantize: --calibration-batch must be a positive integer, got {batch}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError) as error:
        raise ValueError(f"quantize: cannot read --calibration {path!r}: {error}") from None
    if not arrays:
        raise ValueError(f"quantize: --calibration {path!r} holds no arrays")
    ranks = {}
    if os.path.isfile(model_path):
        try:
            for vi in graph_inputs(onnx.load(model_path, load_external_data=False)):
                if vi.type.tensor_type.HasField("shape"):
                    ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
        except Exception:  # the model is checked (and refused with its own message) by quantize itself
            pass
    if any(a.ndim == 0 for a in arrays.values()):
        bad = next(n for n, a in arrays.items() if a.ndim == 0)
        raise ValueError(f"quantize: --calibration array {bad!r} is a scalar; it needs a leading sample axis")
    counts = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise ValueError(f"quantize: --calibration arrays must hold the same number of samples, got {listed}")
    n = next(iter(counts.values()))
    if n == 0:
        raise ValueError(f"quantize: --calibration {path!r} holds no samples")
    per_sample = {name: ranks.get(name) is not None and a.ndim == ranks[name] + 1 for name, a in arrays.items()}
    if any(per_sample.values()):
        return [{name: a[i] if per_sample[name] else a[i : i + 1] for name, a in arrays.items()} for i in range(n)], n
    return [{name: a[i : i + batch] for name, a in arrays.items()} for i in range(0, n, batch)], n


def _quantize(args, qonnx) -> int:
    from .onnx._common import format_table
    from .onnx._quantize import BITS_KEY, QuantizedNode, quantize_model

    if os.path.exists(args.output) and os.path.exists(args.model) and os.path.samefile(args.output, args.model):
        raise ValueError("quantize: OUT.onnx is the input file; write the quantized model to another path")
    calibration, samples = None, 0
    if args.calibration is not None:
        calibration, samples = _calibration_feeds(args.calibration, args.calibration_batch, args.model)
    start = time.perf_counter()
    model, rows = quantize_model(
        args.model, bits=args.bits, block_size=args.block_size, method=args.method, symmetric=args.symmetric,
        accuracy_level=args.accuracy_level, exclude=args.exclude, calibration=calibration,
        sequential=args.sequential, bits_budget=args.bits_budget, desc_act=args.desc_act,
        progress=_progress("quantizing"),
    )  # fmt: skip
    import onnx

    if model.ByteSize() > 2**31 - 2**24:  # protobuf's limit: the weights go to a data file beside it
        onnx.save(model, args.output, save_as_external_data=True, location=os.path.basename(args.output) + ".data")
    else:
        onnx.save(model, args.output)
    table = []
    calibrated = calibration is not None
    err = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    for r in rows:
        if isinstance(r, QuantizedNode):
            note = "weight shared with an earlier node" if r.shared else ""
            if r.method and r.method != args.method:
                note = "; ".join(filter(None, [note, f"{r.method}: no calibration data reaches it"]))
            cells = [r.node, r.op_type, f"{r.K}x{r.N}", r.bits, r.block_size, f"{r.error:.3g}"]
            if calibrated:
                cells += [err(r.output_error_rtn), err(r.output_error)]
        else:
            cells = [r.node, r.op_type, "-", "-", "-", "-"] + (["-", "-"] if calibrated else [])
            note = "not quantized: " + r.reason
        table.append(cells + [note])
    headers = ["node", "op_type", "KxN", "bits", "block", "weight error"]
    if calibrated:
        headers += ["out error rtn", f"out error {args.method}"]
    print(format_table(headers + ["note"], table, "llrrrr" + ("rr" if calibrated else "") + "l"))
    done = [r for r in rows if isinstance(r, QuantizedNode)]
    print(
        f"\n{len(done)} of {len(rows)} MatMul/Gemm nodes quantized (method={args.method}; weight error: "
        f"||W_q - W||^2 / ||W||^2) in {time.perf_counter() - start:.1f} s; wrote {args.output} "
        f"({os.path.getsize(args.output) / 1e6:.2f} MB, from {os.path.getsize(args.model) / 1e6:.2f} MB)"
    )
    if calibrated:
        print(
            f"calibration: {len(calibration)} runs ({samples} samples); out error: ||X W_q - X W||^2 / ||X W||^2 "
            f"over the node's calibration inputs X, for rtn and for {args.method} at the node's bits"
        )
    if args.bits_budget is not None:
        import json

        meta = json.loads(next(p.value for p in model.metadata_props if p.key == BITS_KEY))
        high = sum(r.bits > args.bits for r in done)
        print(
            f"bits budget {args.bits_budget:g}: {high} node(s) raised to 8 bits, {meta['average_bits']:.3f} bits per "
            f"weight on average (codes only, by element count); the bits per node are in metadata_props[{BITS_KEY!r}]"
        )
    return 0


def _compare(args, qonnx) -> int:
    feed = _pairs("compare", "--input", args.input, _npy("compare"))
    dims = _pairs("compare", "--dim", args.dim, _size)
    print(
        f"running {args.model} in ONNX Runtime, every quantized node's output exposed ...", file=sys.stderr, flush=True
    )
    report = qonnx.compare(
        args.model, feed or None, numerics=args.numerics, dims=dims or None, progress=_progress("checking")
    )
    print(report)
    return 0 if report.ok else 1


def _run(args, qonnx) -> int:
    from .onnx._common import format_table

    feed = _pairs("run", "--input", args.input, _npy("run"))
    session = qonnx.InferenceSession(args.model, numerics=args.numerics, fuse_qdq=args.fuse_qdq, tabulate=args.tabulate)
    print(f"running {args.model} on quantmatmul ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    outputs = session.run(None, feed)
    elapsed = time.perf_counter() - start
    os.makedirs(args.output_dir, exist_ok=True)
    table = []
    for arg, value in zip(session.get_outputs(), outputs):
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in arg.name) or "output"
        path = os.path.join(args.output_dir, safe + ".npy")
        np.save(path, value)
        table.append([arg.name, str(value.dtype), "x".join(map(str, value.shape)) or "scalar", path])
    print(format_table(["output", "dtype", "shape", "file"], table))
    count = len(session.fused)
    fused = f", {count} QDQ group{'s' * (count != 1)} fused into QLinearMatMul / QGemm" if count else ""
    count = len(session.tabulated)
    fused += f", {count} element-wise group{'s' * (count != 1)} as lookup tables" if count else ""
    print(f"\n{len(outputs)} outputs in {elapsed:.2f} s (numerics={args.numerics!r}{fused})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
