"""_demo_minilm.py: the main table of `quantmatmul demo`: all-MiniLM-L6-v2 quantized by quantmatmul and by ONNX Runtime's quantizers, each model's sentence embeddings against the float model's (docs/models.md).

    python -m quantmatmul._demo_minilm          # the demo's grid (what `quantmatmul demo` prints last)
    python -m quantmatmul._demo_minilm --full   # every width and block size (the table of docs/models.md)

Every quantizer gets the float graph of quantmatmul.models.minilm and quantizes its 36 weight
MatMuls: quantmatmul.onnx.quantize (rtn, mse, hqq; gptq and mixed 4/8-bit precision calibrated on
models/calibration.txt; MatMulNBits), ONNX Runtime's
MatMulNBitsQuantizer (its rtn; 2 and 4 bits), quantize_dynamic (int8 weights, MatMulInteger) and
quantize_static (QOperator QLinearMatMul, uint8 activations calibrated on six sentences, int8
weights). All sentences of quantmatmul.models.sentences run as one batch; for each model: the
cosine of every sentence's embedding to the float model's (mean, worst), how many sentences keep
their nearest neighbour, the time per batch in ONNX Runtime and in quantmatmul.onnx.InferenceSession,
and quantmatmul.onnx.compare (every quantized node against ONNX Runtime, numerics="exact").
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from .models import minilm
from .models.sentences import SENTENCES, TOPICS

CALIBRATION = [sentences[-1] for sentences in TOPICS.values()]  # one sentence per topic
ORT_REPEATS = 3  # ONNX Runtime runs per model (after one warm-up); the median is shown
CALIBRATION_BATCH = 32  # sentences per calibration run of the gptq and mixed-precision rows


def calibration_text() -> list[str]:
    """The sentences of models/calibration.txt (5,586 MiniLM tokens of ordinary English, none of them one of
    sentences.py's held-out sentences), shuffled with a fixed seed so that any first batches span its topics."""
    from importlib import resources

    text = resources.files("quantmatmul.models").joinpath("calibration.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    order = np.random.default_rng(0).permutation(len(lines))
    return [lines[i] for i in order]


def calibration_feeds(limit=None, batch=CALIBRATION_BATCH) -> list[dict]:
    """calibration_text() (its first `limit` sentences) tokenized in batches of `batch`, each padded to its
    longest sentence: the feeds quantmatmul.onnx.quantize(calibration=...) takes."""
    lines = calibration_text()[:limit]
    return [minilm.tokenize(lines[i : i + batch]) for i in range(0, len(lines), batch)]


@dataclass(frozen=True)
class Config:
    """One row: who quantizes (``quantizer``), how (``method``), and whether to run the model in
    quantmatmul.onnx.InferenceSession and compare() too (``ours``: costly, so not on every row)."""

    quantizer: str  # "float", "quantmatmul", "ORT nbits", "ORT dynamic", "ORT static"
    method: str = "-"
    bits: int | None = None
    block_size: int | None = None
    ours: bool = False
    bits_budget: float | None = None  # quantmatmul: automatic mixed precision on the calibration text
    desc_act: bool = False  # quantmatmul gptq: act-order

    @property
    def label(self) -> str:
        if self.method == "-":
            return self.quantizer
        extra = (" act-order" if self.desc_act else "") + (f" mixed {self.bits_budget:g}" if self.bits_budget else "")
        return f"{self.quantizer} {self.method}{extra}"

    @property
    def calibrated(self) -> bool:
        return self.method == "gptq" or self.bits_budget is not None


def _ours(method, bits, block_size, ours=False, **options):
    return Config("quantmatmul", method, bits, block_size, ours or bits == 3, **options)  # ORT runs no 3-bit model


# The demo's grid, cut to fit `quantmatmul demo` in about a minute and a half on 2 cores (mse takes
# 10-20 s a model there, InferenceSession and compare 5-20 s): mse only where ORT's quantizer has a
# row at the same width and block size, InferenceSession and compare() on one MatMulNBits and one
# QLinearMatMul row (and the 3-bit row, which only InferenceSession runs). FULL_GRID has it all.
DEMO_GRID = (
    Config("float"),
    Config("ORT nbits", "rtn", 4, 32),
    _ours("rtn", 4, 32),
    _ours("mse", 4, 32, ours=True),
    _ours("hqq", 4, 32),
    _ours("gptq", 4, 32),
    _ours("gptq", 4, 32, bits_budget=4.5),
    Config("ORT nbits", "rtn", 4, 128),
    _ours("mse", 4, 128),
    _ours("rtn", 3, 128),
    Config("ORT nbits", "rtn", 2, 128),
    _ours("mse", 2, 128),
    Config("ORT dynamic", "int8", 8),
    Config("ORT static", "int8", 8, ours=True),
)

FULL_GRID = (
    (Config("float"),)
    + tuple(
        config
        for bits in (4, 3, 2)
        for block_size in (32, 128)
        for config in ((Config("ORT nbits", "rtn", bits, block_size),) if bits != 3 else ())
        + tuple(_ours(m, bits, block_size, ours=(m == "mse")) for m in ("rtn", "mse", "hqq", "gptq"))
    )
    + (
        _ours("gptq", 4, 32, ours=True, desc_act=True),
        _ours("gptq", 4, 128, desc_act=True),
        _ours("mse", 4, 32, bits_budget=4.5),
        _ours("gptq", 4, 32, bits_budget=4.5),
        _ours("gptq", 4, 128, bits_budget=4.5),
    )
    + (Config("ORT dynamic", "int8", 8, ours=True), Config("ORT static", "int8", 8, ours=True))
)


@dataclass
class Row:
    config: Config
    quantize_s: float | None = None
    cos_mean: float | None = None
    cos_worst: float | None = None
    same_neighbour: int | None = None
    ort_ms: float | None = None
    ours_ms: float | None = None
    compare: str = "-"
    compare_ok: bool | None = None
    average_bits: float | None = None  # mixed-precision rows: codes per weight, from the model's metadata
    notes: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------
# Quantizing


@contextlib.contextmanager
def _quiet():
    """ONNX Runtime's quantization tools log at INFO and WARNING, print to stdout, and the nbits quantizer's
    module calls logging.basicConfig when imported: silenced here, and the root logger left as it was."""
    root = logging.getLogger()
    level, handlers, disabled = root.level, list(root.handlers), root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            yield
    finally:
        logging.disable(disabled)
        root.setLevel(level)
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)


class _Calibration:
    """ONNX Runtime's CalibrationDataReader protocol: one sentence per batch (no padding in the ranges)."""

    def __init__(self):
        self._feeds = iter([minilm.tokenize([s]) for s in CALIBRATION])

    def get_next(self):
        return next(self._feeds, None)


def quantize(config: Config, model, workdir: str):
    """The quantized model (onnx.ModelProto) for one row, from the float model."""
    import onnx

    if config.quantizer == "float":
        return model
    if config.quantizer == "quantmatmul":
        from .onnx import quantize as qm_quantize

        options = {}
        if config.calibrated:
            options = dict(calibration=calibration_feeds(), bits_budget=config.bits_budget, desc_act=config.desc_act)
        return qm_quantize(model, bits=config.bits, block_size=config.block_size, method=config.method, **options)
    weights = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1].endswith(".weight_T")]
    with _quiet():
        if config.quantizer == "ORT nbits":
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            quantizer = MatMulNBitsQuantizer(
                onnx.ModelProto.FromString(model.SerializeToString()),
                bits=config.bits,
                block_size=config.block_size,
                is_symmetric=False,
            )
            quantizer.process()
            return quantizer.model.model
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

        source, target = os.path.join(workdir, "float.onnx"), os.path.join(workdir, "quantized.onnx")
        if not os.path.exists(source):
            onnx.save(model, source)
        common = dict(op_types_to_quantize=["MatMul"], nodes_to_quantize=weights, weight_type=QuantType.QInt8)
        if config.quantizer == "ORT dynamic":
            quantize_dynamic(source, target, **common)
        else:
            quantize_static(
                source,
                target,
                _Calibration(),
                quant_format=QuantFormat.QOperator,
                activation_type=QuantType.QUInt8,
                **common,
            )
        return onnx.load(target)


# ---------------------------------------------------------------------------------------------------
# Measuring


def _ort_session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _cosines(embeddings, reference):
    e, r = embeddings.astype(np.float64), reference.astype(np.float64)
    return (e * r).sum(axis=1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(r, axis=1))


def nearest_neighbours(embeddings) -> np.ndarray:
    """For each sentence the index of its nearest other sentence, by cosine."""
    e = embeddings.astype(np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    cos = e @ e.T
    np.fill_diagonal(cos, -np.inf)
    return cos.argmax(axis=1)


def _timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def _ort_runs(config: Config) -> bool:
    return config.bits != 3  # ONNX Runtime's MatMulNBits runs 2, 4 and 8 bits


def quantize_in_threads(configs, model, threads: int) -> dict:
    """{config: Future of (quantized model, CPU seconds of the thread that quantized it)} for the
    quantmatmul rows, quantized `threads` at a time (numpy releases the GIL in its array operations) before
    anything is timed. ONNX Runtime's quantizers run in the main thread, one at a time, timed by the clock."""
    from concurrent.futures import ThreadPoolExecutor

    def job(config):
        start = time.thread_time()
        quantized = quantize(config, model, None)
        return quantized, time.thread_time() - start

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = {config: pool.submit(job, config) for config in configs if config.quantizer == "quantmatmul"}
    return futures


def measure(config: Config, model, feeds, reference, workdir, quantized=None) -> Row:
    """Quantize (timed; or take quantize_in_threads' result), run in ONNX Runtime (median of ORT_REPEATS) and,
    for config.ours, in quantmatmul.onnx.InferenceSession and compare(); accuracy from ORT's embeddings, or
    ours where ORT cannot run."""
    row = Row(config)
    quantized, seconds = quantized.result() if quantized else _timed(lambda: quantize(config, model, workdir))
    if config.quantizer != "float":
        row.quantize_s = seconds
    if config.bits_budget is not None:
        import json

        from .onnx._quantize import BITS_KEY

        meta = json.loads(next(p.value for p in quantized.metadata_props if p.key == BITS_KEY))
        row.average_bits = meta["average_bits"]
        raised = sum(b > config.bits for b in meta["nodes"].values())
        row.notes.append(
            f"{config.label}: {raised} of {len(meta['nodes'])} MatMuls raised to 8 bits by sensitivity, "
            f"{meta['average_bits']:.3f} bits per weight on average (codes only)"
        )
    if config.calibrated:
        row.notes.append(
            f"calibrated rows: {len(calibration_text())} sentences of quantmatmul/models/calibration.txt "
            f"(5,586 tokens, none of the evaluation sentences) in batches of {CALIBRATION_BATCH}"
        )
    embeddings = None
    if _ort_runs(config):
        session = _ort_session(quantized)
        embeddings = session.run(None, feeds)[0]
        row.ort_ms = 1e3 * statistics.median(_timed(lambda: session.run(None, feeds))[1] for _ in range(ORT_REPEATS))
    if config.ours:
        from .onnx import InferenceSession, compare

        session = InferenceSession(quantized)
        ours, seconds = _timed(lambda: session.run(None, feeds)[0])
        row.ours_ms = 1e3 * seconds
        if embeddings is None:
            embeddings = ours
            row.notes.append(
                "3-bit rows: accuracy from quantmatmul.onnx.InferenceSession (ORT runs no 3-bit MatMulNBits)"
            )
        if _ort_runs(config) and config.quantizer != "float":
            report = compare(quantized, feeds, numerics="exact")
            bad = [r for r in report.rows if r["ok"] is False]
            row.compare_ok = report.ok
            row.compare = "ok" if report.ok else f"{len(bad)} of {len(report.rows)} differ"
    cos = _cosines(embeddings, reference)
    row.cos_mean, row.cos_worst = float(cos.mean()), float(cos.min())
    row.same_neighbour = int((nearest_neighbours(embeddings) == nearest_neighbours(reference)).sum())
    return row


# ---------------------------------------------------------------------------------------------------
# The table


def _cell(value, spec):
    return "-" if value is None else format(value, spec)


_COLUMNS = (
    ("quantizer", 26),
    ("bits", 4),
    ("block", 5),
    ("quantize s", 10),
    ("mean cos", 8),
    ("worst cos", 9),
    ("same NN", 7),
    ("ORT ms", 6),
    ("ours ms", 7),
    ("compare (exact)", 15),
)


def _line(cells) -> str:
    return "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, (_, w)) in enumerate(zip(cells, _COLUMNS)))


def table_header() -> str:
    return _line([name for name, _ in _COLUMNS])


def table_row(r: Row, n_sentences: int) -> str:
    return _line(
        [
            r.config.label,
            _cell(r.config.bits, "d") if r.average_bits is None else f"{r.average_bits:.2f}",
            _cell(r.config.block_size, "d"),
            _cell(r.quantize_s, ".1f"),
            _cell(r.cos_mean, ".4f"),
            _cell(r.cos_worst, ".4f"),
            "-" if r.same_neighbour is None else f"{r.same_neighbour}/{n_sentences}",
            _cell(r.ort_ms, ".0f"),
            _cell(r.ours_ms, ".0f"),
            r.compare,
        ]
    )


def mse_against_ort(rows) -> list[str]:
    """One line per (bits, block_size) where both quantmatmul mse and ORT's quantizer ran: the mean cosines."""
    ort = {(r.config.bits, r.config.block_size): r for r in rows if r.config.quantizer == "ORT nbits"}
    lines = []
    for r in rows:
        key = (r.config.bits, r.config.block_size)
        if r.config.label == "quantmatmul mse" and key in ort:
            theirs = ort[key]
            verdict = "closer" if r.cos_mean >= theirs.cos_mean else "FARTHER"
            lines.append(
                f"  {key[0]} bits, block {key[1]}: mse {r.cos_mean:.4f} vs ORT rtn {theirs.cos_mean:.4f}: "
                f"{verdict} (1 - cos {1 - r.cos_mean:.2e} vs {1 - theirs.cos_mean:.2e})"
            )
    return lines


def gptq_against_others(rows) -> list[str]:
    """One line per (bits, block_size) with a gptq row: its mean cosine against mse's and rtn's (and act-order's)."""
    cells: dict = {}
    for r in rows:
        if r.config.quantizer == "quantmatmul" and r.cos_mean is not None and r.config.bits_budget is None:
            key = (r.config.bits, r.config.block_size)
            cells.setdefault(key, {})[r.config.method + (" act-order" if r.config.desc_act else "")] = r.cos_mean
    lines = []
    for (bits, block), c in cells.items():
        if "gptq" not in c:
            continue
        others = ", ".join(f"{m} {c[m]:.4f}" for m in ("gptq act-order", "mse", "hqq", "rtn") if m in c)
        order = [m for m in ("gptq", "mse", "rtn") if m in c]
        ranked = all(c[a] > c[b] for a, b in zip(order, order[1:]))
        lines.append(
            f"  {bits} bits, block {block}: gptq {c['gptq']:.4f}; {others}"
            + (f" ({' > '.join(order)}: {'yes' if ranked else 'NO'})" if len(order) > 1 else "")
        )
    return lines


def run(grid=None, out=None) -> bool:
    """Print the table for grid (default DEMO_GRID), a row as each is measured. True unless a check fails: the float graph against the numpy forward
    pass, and compare() on every MatMulNBits row it ran on. Without MiniLM or onnx/onnxruntime, says so."""
    out = out or sys.stdout
    print("\n== all-MiniLM-L6-v2 quantized end to end: sentence embeddings against the float model's", file=out)
    try:
        import onnxruntime

        from . import onnx as _  # noqa: F401

        model = minilm.onnx_model()
        feeds = minilm.tokenize(SENTENCES)
    except ImportError as error:
        print(f"  skipped: {error}", file=out)
        return True
    from ._runtime import get_num_threads

    reference = _ort_session(model).run(None, feeds)[0]
    few = minilm.tokenize(CALIBRATION)
    graph_error = float(np.abs(_ort_session(model).run(None, few)[0] - minilm.minilm_numpy(few)).max())
    ok = graph_error < 1e-5
    print(
        f"  float graph (onnx.helper, {len(model.graph.node)} nodes) in ONNX Runtime {onnxruntime.__version__} "
        f"against the numpy forward pass: max |diff| {graph_error:.1e}{'' if ok else ' MISMATCH'}",
        file=out,
    )
    batch, seq = feeds["input_ids"].shape
    print(
        f"  {batch} sentences (6 topics) in one batch of {seq} tokens; ORT and ours on {get_num_threads()} threads; "
        f"cos: each sentence's embedding against the float model's; same NN: sentences whose nearest other "
        f"sentence is the float model's",
        file=out,
    )
    start = time.perf_counter()
    grid = DEMO_GRID if grid is None else grid
    threads = min(2, get_num_threads())
    n_ours = sum(c.quantizer == "quantmatmul" for c in grid)
    print(f"  quantizing {n_ours} models with quantmatmul.onnx.quantize, {threads} at a time ...", file=out, flush=True)
    ours = quantize_in_threads(grid, model, threads)
    print(table_header(), file=out, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for config in grid:
            try:
                row = measure(config, model, feeds, reference, workdir, ours.pop(config, None))
            except Exception as error:  # a quantizer or runtime that cannot do this row: say why, go on
                row = Row(config, compare="not run [!]", notes=[f"[!] {config.label}: {type(error).__name__}: {error}"])
            rows.append(row)
            print(table_row(row, batch), file=out, flush=True)
            if config.quantizer == "quantmatmul" and (row.compare_ok is False or row.cos_mean is None):
                ok = False
    notes = sorted({note for r in rows for note in r.notes})
    for note in notes:
        print(f"  {note}", file=out)
    print(
        f"  quantize s: quantmatmul's in CPU seconds of its thread ({threads} at a time, before any timing), ONNX "
        f"Runtime's by the clock; ORT ms: median of {ORT_REPEATS} runs of the batch; ours ms: one run in "
        "quantmatmul.onnx.InferenceSession (onnx.reference with quantmatmul's kernels), on the rows that show it; "
        "compare (exact): quantmatmul.onnx.compare, every quantized node against ONNX Runtime",
        file=out,
    )
    lines = mse_against_ort(rows)
    if lines:
        print("  mse against ONNX Runtime's quantizer (mean cosine to float):", file=out)
        print("\n".join(lines), file=out)
    lines = gptq_against_others(rows)
    if lines:
        print("  gptq against the methods without calibration (mean cosine to float):", file=out)
        print("\n".join(lines), file=out)
    print(f"  ({time.perf_counter() - start:.0f} s)", file=out)
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quantmatmul._demo_minilm", description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="every width and block size (docs/models.md)")
    args = parser.parse_args(argv)
    return 0 if run(FULL_GRID if args.full else DEMO_GRID) else 1


if __name__ == "__main__":
    sys.exit(main())
