"""peer_deviations.py: the peers' documented bugs and limitations, keyed on the peer's version (and CPU), and the report of which still hold.

Each deviation the README and docs/ document is one entry in DEVIATIONS: the peer it belongs to, one
line saying what it is, and the release that fixed it (None: every release checked has it). A test
that exercises one calls ``deviation(key, present)`` with what the installed peer actually did:

* on the pinned version (constraints.txt, the one ``make test`` installs) it must be what the entry
  says, or the test fails;
* on any other version (``make test-latest``, or a peer installed by hand) it is only recorded, and
  the test goes on to check the peer's new behaviour (a limitation lifted must compute correctly).

The run ends with one line per deviation exercised (conftest.py): ``holds``, ``fixed in <version>``
as documented, or ``GONE in <version>`` / ``BACK in <version>`` where a release changed it and this
file and the README's peer tables need updating.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"


@dataclasses.dataclass(frozen=True)
class Deviation:
    peer: str  # distribution name
    what: str  # one line, as the README says it
    fixed_in: str | None = None  # first release without it; None: every release checked has it
    cpu: str | None = None  # a key of CPU_CONDITIONS where it also depends on the CPU


def _ort_u8s8_kernel_saturates() -> bool:
    """ORT's x86 u8 x s8 QGEMM kernels use vpmaddubsw, whose int16 pair sums saturate, unless the CPU
    has AVX-VNNI or (OS-enabled) AVX512-VNNI; without AVX2 its SSE kernel widens to int16 first."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    import quantmatmul

    f = quantmatmul.cpu_info()["features"]
    vnni = f["avx_vnni"] or (f["avx512_vnni"] and f["os_avx512"])
    return bool(f["avx2"] and f["os_avx"] and not vnni)


CPU_CONDITIONS = {"x86 with AVX2, without VNNI": _ort_u8s8_kernel_saturates}

DEVIATIONS = {
    # ONNX Runtime, QLinearMatMul
    "ort-qlinear-k0": Deviation(
        "onnxruntime", "QLinearMatMul with K = 0 returns uninitialized values, not y_zero_point"
    ),
    "ort-qlinear-u8s8-int16": Deviation(
        "onnxruntime",
        "QLinearMatMul u8·s8 saturates int16 pair sums (onnxruntime#16105)",
        cpu="x86 with AVX2, without VNNI",
    ),
    "ort-qlinearconv-types": Deviation(
        "onnxruntime", "QLinearConv has kernels for (x, w, y) u8/u8/u8, u8/s8/u8 and s8/s8/s8 only"
    ),
    "ort-conv-same-dilations": Deviation(
        "onnxruntime", "QLinearConv refuses dilations with auto_pad SAME_UPPER / SAME_LOWER"
    ),
    "ort-convinteger-per-channel": Deviation("onnxruntime", "ConvInteger refuses a per-channel w_zero_point"),
    "ort-pool-same-dilations": Deviation(
        "onnxruntime", "MaxPool with auto_pad SAME and dilations pads for the undilated kernel"
    ),
    # ONNX Runtime, MatMulNBits
    "ort-nbits-8bit-float-zp": Deviation("onnxruntime", "MatMulNBits refuses 8-bit weights with float zero points"),
    "ort-nbits-g-idx-uint8-zp": Deviation("onnxruntime", "MatMulNBits 4-bit with g_idx ignores uint8 zero points"),
    "ort-nbits-2bit-g-idx": Deviation("onnxruntime", "MatMulNBits 2-bit with g_idx decodes B as 4-bit codes"),
    "ort-nbits-8bit-g-idx": Deviation("onnxruntime", "MatMulNBits refuses 8-bit weights with g_idx"),
    "ort-nbits-block-over-256": Deviation(
        "onnxruntime", "MatMulNBits refuses block_size > 256 (4 and 8 bits, no g_idx)", fixed_in="1.32.0"
    ),
    "ort-nbits-block-over-256-2bit": Deviation("onnxruntime", "MatMulNBits refuses block_size > 256 at 2 bits"),
    "ort-nbits-block-over-256-g-idx": Deviation("onnxruntime", "MatMulNBits refuses block_size > 256 with g_idx"),
    "ort-nbits-bits": Deviation("onnxruntime", "MatMulNBits refuses bits 3, 5, 6 and 7"),
    "ort-nbits-bfloat16": Deviation("onnxruntime", "MatMulNBits has no bfloat16 A on the CPU EP"),
    "ort-quantizer-block-over-256": Deviation("onnxruntime", "MatMulNBits quantizer refuses block_size > 256"),
    "ort-quantizer-inf-scale": Deviation(
        "onnxruntime", "MatMulNBits quantizer: a block spanning +-FLT_MAX gets an infinite scale"
    ),
    # ONNX Runtime, QuantizeLinear / DequantizeLinear
    "ort-quantize-int32": Deviation(
        "onnxruntime",
        "QuantizeLinear's float16, blocked and int4 kernels convert through int32 (+Inf -> minimum)",
        fixed_in="1.32.0",
    ),
    "ort-quantize-dtypes": Deviation(
        "onnxruntime", "Quantize/DequantizeLinear refuse bfloat16 and float64, and scales of another dtype than x"
    ),
    "ort-quantize-blocked-scale-1": Deviation(
        "onnxruntime", "Quantize/DequantizeLinear refuse a blocked scale of shape (1,) (taken as per-tensor)"
    ),
    "ort-float8-zero-point": Deviation(
        "onnxruntime", "QuantizeLinear ignores nonzero float8 zero points; DequantizeLinear refuses them, -0 too"
    ),
    "ort-float8-unsaturated-quirks": Deviation(
        "onnxruntime", "QuantizeLinear saturate=0: e4m3fn [480, 496) -> +-448, e5m2 [61440, 65536) -> NaN"
    ),
    # onnx.reference
    "onnx-qlinear-1d-shape": Deviation("onnx", "QLinearMatMul 1-D x 1-D with [1]-shaped scales returns shape (1,)"),
    "onnx-quantize-int32": Deviation(
        "onnx", "QuantizeLinear converts through int32 (+Inf -> minimum, NaN wraps with a negative zero point)"
    ),
    "onnx-quantize-16-bit-division": Deviation(
        "onnx", "QuantizeLinear divides float16 and bfloat16 in 16 bits (the quotient rounded twice)"
    ),
    "onnx-e5m2-nan": Deviation("onnx", "QuantizeLinear gives 0x7E/0xFE for NaN in float8e5m2 (onnxruntime 0x7F/0xFF)"),
    "onnx-float8-zero-point": Deviation("onnx", "QuantizeLinear ignores nonzero float8 zero points"),
    "onnx-qlinearconv-per-channel": Deviation(
        "onnx", "QLinearConv with per-channel w_scale fails (1-D) or scales the wrong axis (3-D) beyond 2-D"
    ),
    "onnx-maxpool-pads": Deviation(
        "onnx", "MaxPool reads pads as (begin, end) per axis and pads SAME_LOWER as SAME_UPPER (some paths)"
    ),
    "onnx-softmax-before-13": Deviation(
        "onnx", "Softmax / LogSoftmax / Hardmax before opset 13 normalize along axis alone, not over the 2-D coercion"
    ),
    "onnx-omitted-output-read-as-input": Deviation(
        "onnx", "An omitted optional output (named '') is stored, and a later omitted optional input reads it"
    ),
}


@functools.cache
def pinned_versions() -> dict[str, str]:
    """{canonical name: version} from constraints.txt, environment markers evaluated."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            (spec,) = req.specifier
            pins[canonicalize_name(req.name)] = spec.version
    return pins


@functools.cache
def installed(peer: str) -> str:
    return metadata.version(peer)


def pinned(peer: str) -> bool:
    """Whether the installed peer is the version constraints.txt pins (the one the tables document)."""
    return installed(peer) == pinned_versions().get(canonicalize_name(peer))


def pinned_only(peer: str, what: str):
    """A pytest mark skipping a test that reproduces the pinned release of peer bit for bit (``what``: the
    claim) where another release is installed (the device host's, make test-latest's)."""
    import pytest

    return pytest.mark.skipif(
        not pinned(peer),
        reason=f"{what}: {peer} {pinned_versions().get(canonicalize_name(peer))}; {installed(peer)} is installed",
    )


def documented(key: str) -> bool:
    """Whether the installed peer has this deviation (on this CPU), by the table above."""
    dev = DEVIATIONS[key]
    if dev.fixed_in is not None and Version(installed(dev.peer)) >= Version(dev.fixed_in):
        return False
    return dev.cpu is None or CPU_CONDITIONS[dev.cpu]()


OBSERVED: dict[str, set[bool]] = {}


def deviation(key: str, present: bool) -> bool:
    """Records whether the installed peer showed deviation `key`; on the pinned version it must be as
    documented. Returns `present`, so that a test can go on to check a fixed peer's results."""
    dev = DEVIATIONS[key]
    OBSERVED.setdefault(key, set()).add(bool(present))
    expected = documented(key)
    if bool(present) != expected and pinned(dev.peer):
        raise AssertionError(
            f"{dev.peer} {installed(dev.peer)} (the pinned version): '{dev.what}' is documented as "
            f"{'holding' if expected else 'not holding'} here but {'holds' if present else 'does not'}: "
            f"update tests/peer_deviations.py, the README's peer tables and docs/"
        )
    return bool(present)


def peer_refuses(key: str, run, message: str):
    """(refused, result) of run(): a refusal (any exception) records `key` as present, and on the
    pinned version its message must match the regular expression `message`; a result records it as gone."""
    try:
        result = run()
    except Exception as error:  # the peers raise their own exception types
        deviation(key, True)
        if pinned(DEVIATIONS[key].peer):
            assert re.search(message, str(error)), f"{key}: {error}"
        return True, None
    deviation(key, False)
    return False, result


def _status(key: str, seen: set[bool]) -> str:
    dev = DEVIATIONS[key]
    version, expected = installed(dev.peer), documented(key)
    if len(seen) > 1:
        return f"MIXED in {version}"
    present = seen == {True}
    if present and expected:
        return "holds" if dev.fixed_in is None else f"holds (fixed in {dev.fixed_in})"
    if not present and not expected:
        if dev.fixed_in is not None and Version(version) >= Version(dev.fixed_in):
            return f"fixed in {dev.fixed_in}"
        return "not on this CPU"
    return f"BACK in {version}" if present else f"GONE in {version}"


def summary_lines() -> list[str]:
    """The end-of-run report: one line per deviation the run exercised, grouped by peer."""
    lines = []
    for peer in sorted({DEVIATIONS[k].peer for k in OBSERVED}):
        keys = [k for k in DEVIATIONS if k in OBSERVED and DEVIATIONS[k].peer == peer]
        version = installed(peer)
        note = "pinned" if pinned(peer) else f"not the pinned {pinned_versions().get(canonicalize_name(peer))}"
        lines.append(f"{peer} {version} ({note}): documented deviations")
        statuses = {k: _status(k, OBSERVED[k]) for k in keys}
        width = max(len(s) for s in statuses.values())
        lines += [f"  {statuses[k]:<{width}}  {DEVIATIONS[k].what}" for k in keys]
        changed = [k for k in keys if statuses[k].split()[0] in ("GONE", "BACK", "MIXED")]
        if changed:
            lines.append(
                f"  {len(changed)} changed in {peer} {version}: update tests/peer_deviations.py, "
                f"the README's peer tables and docs/"
            )
    return lines
