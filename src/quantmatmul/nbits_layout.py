"""nbits_layout.py: the MatMulNBits byte layout: LSB-first bitstreams of 2..8-bit codes, pack_nbits / unpack_nbits.

Each row of B (and of packed zero points) is one contiguous bitstream, least significant bit first:
code i occupies bits [i*bits, (i+1)*bits) of the row, bit j of the stream being bit (j % 8) of
byte j // 8. For 2, 4 and 8 bits this is exactly ONNX Runtime's layout (4-bit: the first code in
the low nibble); for 3, 5, 6 and 7 bits it is the same rule (the layout of the ONNX proposal).
A block of block_size >= 16 codes (a power of two) is a whole number of bytes, block_size*bits/8,
so B has shape [N, k_blocks, blob_size] with each block's codes in its own blob.
"""

from __future__ import annotations

import numpy as np

from . import _core

__all__ = ["pack_nbits", "unpack_nbits", "packed_size"]


def packed_size(count: int, bits: int) -> int:
    """Bytes that count codes of the given width take: ceil(count * bits / 8)."""
    return (count * bits + 7) // 8


def _check_bits(fn: str, bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 8:
        raise ValueError(f"{fn}: bits must be an integer in 2..8, got {bits!r}")
    return int(bits)


def pack_nbits(codes, bits: int) -> np.ndarray:
    """Pack unsigned codes (each < 2**bits) along the last axis into LSB-first bytes.

    >>> pack_nbits(np.array([1, 2, 3, 4], np.uint8), 4)
    array([33, 67], dtype=uint8)
    """
    bits = _check_bits("pack_nbits", bits)
    codes = np.asarray(codes)
    if codes.dtype.kind not in "ui":
        raise TypeError(f"pack_nbits: codes must be an integer array, got {codes.dtype}")
    if codes.ndim == 0:
        raise ValueError("pack_nbits: codes must have at least 1 dimension")
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise ValueError(f"pack_nbits: codes must lie in 0..{(1 << bits) - 1} for bits={bits}, "
                         f"got values in {codes.min()}..{codes.max()}")
    count = codes.shape[-1]
    stream = np.unpackbits(codes.astype(np.uint8)[..., None], axis=-1, bitorder="little")[..., :bits]
    stream = stream.reshape(codes.shape[:-1] + (count * bits,))
    return np.packbits(stream, axis=-1, bitorder="little")


def unpack_nbits(data, bits: int, count: int) -> np.ndarray:
    """The first count codes of each LSB-first bitstream along the last axis of data (uint8).

    >>> unpack_nbits(np.array([33, 67], np.uint8), 4, 4)
    array([1, 2, 3, 4], dtype=uint8)
    """
    bits = _check_bits("unpack_nbits", bits)
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise TypeError(f"unpack_nbits: data must be uint8, got {data.dtype}")
    if data.ndim == 0:
        raise ValueError("unpack_nbits: data must have at least 1 dimension")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"unpack_nbits: count must be a non-negative integer, got {count!r}")
    if packed_size(count, bits) > data.shape[-1]:
        raise ValueError(f"unpack_nbits: {count} codes of {bits} bits need {packed_size(count, bits)} bytes per row, "
                         f"data has {data.shape[-1]}")
    rows = np.ascontiguousarray(data).reshape(-1, data.shape[-1])
    return _core.decode_nbits(rows, bits, count).reshape(data.shape[:-1] + (count,))
