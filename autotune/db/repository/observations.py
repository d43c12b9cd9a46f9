"""Observation packing: a logged transition stores its observation's used head (the
header and the occupied slots) as zlib-compressed float32, and reads it back
zero-padded to the observation's size."""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["pack_observation", "unpack_observation"]


def pack_observation(observation: np.ndarray, used: int) -> bytes:
    """An observation as a transition stores it: its first ``used`` entries (the header
    and the occupied slots; the rest are zeros) as zlib-compressed float32."""
    head = np.ascontiguousarray(np.asarray(observation, dtype=np.float32)[:used])
    return zlib.compress(head.tobytes(), 1)


def unpack_observation(blob: bytes, size: int | None = None) -> np.ndarray:
    """The observation ``pack_observation`` stored, zero-padded to ``size`` entries
    (``None``: the stored entries only)."""
    head = np.frombuffer(zlib.decompress(blob), dtype=np.float32)
    if size is None:
        return head.copy()
    out = np.zeros(size, dtype=np.float32)
    out[: len(head)] = head[:size]
    return out
