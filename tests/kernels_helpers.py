"""Helpers shared by the kernel tests: the backends to compare, sizes, and a comparison
that says where two tensors differ."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from autotune.kernels import backend, use_backend

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
# Odd element counts and 2-D shapes: partial blocks everywhere.
SHAPES = [(1,), (127,), (4097,), (1_000_003,), (3, 129), (61, 4097)]
SHAPE_IDS = ["1", "127", "4097", "1000003", "3x129", "61x4097"]
PATHS = ["kernel", "reference"]

# The tensors the kernel path runs on: CUDA when compiled kernels can run, else CPU
# (through the interpreter).
DEVICE = torch.device(
    "cuda" if torch.cuda.is_available() and backend("cuda") == "triton" else "cpu"
)


@contextlib.contextmanager
def path(name: str) -> Iterator[str]:
    """Run the block on the Triton path ("kernel") or the pure-torch reference; yields the
    backend name the calls must record. Skips the Triton path where it cannot run."""
    if name == "reference":
        with use_backend("reference"):
            yield "reference"
        return
    expected = backend(DEVICE)
    if expected == "reference":
        pytest.skip(
            f"Triton cannot run on {DEVICE} here (no CUDA, TRITON_INTERPRET unset or Triton "
            "missing)"
        )
    with use_backend("triton"):
        yield expected


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).to(torch.float64).cpu()


def assert_close_report(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    name: str,
    equal_nan: bool = True,
    shown: int = 5,
) -> None:
    """Fail, saying how many elements differ, the first flat indices with both values,
    and the largest absolute and relative error, unless |actual - expected| <= atol +
    rtol * |expected| everywhere (NaN matches NaN when ``equal_nan``). atol = rtol = 0 is
    exact equality (-0.0 equals 0.0)."""
    assert actual.shape == expected.shape, (
        f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    a, e = _flat(actual), _flat(expected)
    both_nan = torch.isnan(a) & torch.isnan(e)
    same_inf = torch.isinf(a) & (a == e)
    diff = (a - e).abs()
    ok = (diff <= atol + rtol * e.abs()) | same_inf
    if equal_nan:
        ok |= both_nan
    bad = torch.nonzero(~ok).squeeze(1)
    if bad.numel() == 0:
        return
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else float("nan")
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    max_rel = float(rel[finite].max()) if finite.any() else float("nan")
    lines = [
        f"{name}: {bad.numel()} of {a.numel()} elements differ (atol={atol}, rtol={rtol}); "
        f"max abs error {max_abs:.6g}, max rel error {max_rel:.6g}; first:"
    ]
    lines += [f"  [{int(i)}] actual {a[i].item()!r} expected {e[i].item()!r}" for i in bad[:shown]]
    raise AssertionError("\n".join(lines))


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, *, name: str) -> None:
    """Bit-for-bit equality of two tensors of one dtype (NaN payloads and -0.0 included)."""
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, (
        f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = as_int[actual.element_size()]
    a = actual.detach().reshape(-1).view(bits).cpu()
    e = expected.detach().reshape(-1).view(bits).cpu()
    bad = torch.nonzero(a != e).squeeze(1)
    if bad.numel():
        av, ev = actual.detach().reshape(-1).cpu(), expected.detach().reshape(-1).cpu()
        shown = ", ".join(
            f"[{int(i)}] {av[i].item()!r} (0x{int(a[i]) & 0xFFFFFFFF:x}) vs "
            f"{ev[i].item()!r} (0x{int(e[i]) & 0xFFFFFFFF:x})"
            for i in bad[:5]
        )
        raise AssertionError(f"{name}: {bad.numel()} of {a.numel()} elements differ: {shown}")
