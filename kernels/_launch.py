"""Which implementation a kernel call runs: compiled Triton, Triton's interpreter, or the
pure-torch reference; and how a kernel is launched (block and tile sizes, num_warps, grids).

The rule, for a call whose tensors live on ``device``:

- ``"reference"`` when Triton is not installed, when :func:`use_backend` forces it, or when
  the tensors are not on a CUDA device and the interpreter is off;
- ``"triton-interpreter"`` when Triton was imported with ``TRITON_INTERPRET=1`` (Triton
  decides this when it is imported, so set the variable before anything imports it); every
  kernel then runs through the interpreter, CPU and CUDA tensors alike;
- ``"triton"`` for CUDA tensors otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Final, Literal, get_args

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton wheel for this platform: every call takes the reference
    triton = None
    tl = None

__all__ = [
    "Backend",
    "backend",
    "block",
    "cast_rne",
    "cdiv",
    "constexpr",
    "grid",
    "interpreting",
    "jit",
    "max_programs",
    "next_power_of_2",
    "num_warps",
    "persistent_programs",
    "record",
    "resolve",
    "tile_rows",
    "tl",
    "triton_available",
    "use_backend",
]

Backend = Literal["triton", "triton-interpreter", "reference"]
Choice = Literal["auto", "triton", "reference"]

_FORCED: ContextVar[Choice] = ContextVar("autotune_kernels_forced", default="auto")
_LAST: ContextVar[Backend | None] = ContextVar("autotune_kernels_last", default=None)


def jit(fn: Any) -> Any:
    """``triton.jit`` where Triton is installed; the function unchanged elsewhere (it is
    then never launched)."""
    return fn if triton is None else triton.jit(fn)


def constexpr(value: float) -> Any:
    """A module-level constant a kernel may read (``tl.constexpr``; the number itself
    without Triton)."""
    return value if tl is None else tl.constexpr(value)


def _probe() -> None:
    """A jit function made now shows whether Triton runs kernels through its interpreter."""


_PROBE: Final = jit(_probe)
_INTERPRETING: Final[bool] = triton is not None and type(_PROBE).__name__ == "InterpretedFunction"


def triton_available() -> bool:
    """Whether Triton is installed."""
    return triton is not None


def interpreting() -> bool:
    """Whether Triton runs every kernel through its interpreter (``TRITON_INTERPRET=1``
    when Triton was imported)."""
    return _INTERPRETING


def _device_of(where: torch.Tensor | torch.device | str) -> torch.device:
    if isinstance(where, torch.Tensor):
        return where.device
    return torch.device(where)


def resolve(device: torch.device) -> Backend:
    """The backend a kernel call on tensors on ``device`` takes now (see the module
    docstring); raises ``ValueError`` when :func:`use_backend` asks for Triton where it
    cannot run."""
    forced = _FORCED.get()
    if forced == "reference":
        return "reference"
    if triton is None:
        chosen: Backend = "reference"
    elif _INTERPRETING:
        chosen = "triton-interpreter"
    elif device.type == "cuda":
        chosen = "triton"
    else:
        chosen = "reference"
    if forced == "triton" and chosen == "reference":
        why = (
            "Triton is not installed"
            if triton is None
            else f"tensors on {device} need TRITON_INTERPRET=1 (set before triton is imported)"
        )
        raise ValueError(f"use_backend('triton'): Triton cannot run here: {why}")
    return chosen


def record(used: Backend) -> None:
    """Remember the backend the current call used, for :func:`backend`."""
    _LAST.set(used)


def backend(where: torch.Tensor | torch.device | str | None = None) -> Backend:
    """Which implementation runs the kernels.

    With a tensor or device: the backend a kernel call on tensors there would take now.
    Without an argument: the backend the most recent kernel call in this thread (or async
    task) used, or, before any call, the one a call on CPU tensors would take.
    """
    if where is not None:
        return resolve(_device_of(where))
    last = _LAST.get()
    return last if last is not None else resolve(torch.device("cpu"))


@contextlib.contextmanager
def use_backend(choice: Choice) -> Iterator[None]:
    """Force the backend within a ``with`` block (this thread or async task only).

    ``"reference"``: the pure-torch reference everywhere. ``"triton"``: Triton, compiled or
    interpreted, and a ``ValueError`` from any call where it cannot run. ``"auto"``: the
    module's rule.
    """
    if choice not in get_args(Choice):
        raise ValueError(f"backend choice must be one of {get_args(Choice)}, not {choice!r}")
    token = _FORCED.set(choice)
    try:
        yield
    finally:
        _FORCED.reset(token)


@jit
def cast_rne(x: tl.tensor, DTYPE: tl.constexpr) -> tl.tensor:
    """fp32 ``x`` rounded to ``DTYPE`` to nearest, ties to even, as torch rounds. bfloat16
    is rounded here in integer arithmetic: Triton's interpreter truncates instead."""
    if tl.bfloat16 == DTYPE:
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(x != x, 0x7FC0, rounded)  # NaN: torch's canonical bfloat16 NaN
        y = rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(DTYPE)
    return y


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two that is at least ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# Launch heuristics: every kernel takes its block or tile size, num_warps and grid from
# the helpers below, so the rules (and the interpreter's exception) are stated once.

# Elements one program covers under the interpreter, whatever the kernel's compiled size:
# the interpreter runs a launch's programs one after another, each a Python walk through
# the kernel with numpy over the whole block, so the cost is per program and fewer,
# larger programs are cheaper. At 1 << 16 the largest test tensor (1,000,003 elements)
# takes 16 programs, against 245 at top-k's compiled block of 4096 and 977 at
# scatter-add's 1024.
_INTERPRETER_BLOCK: Final = 1 << 16


def block(compiled: int) -> int:
    """The elements one program covers (a block, or the tile of a kernel that takes several
    rows a program) for a kernel whose compiled launch covers ``compiled``: that size when
    compiled, ``1 << 16`` under the interpreter."""
    return _INTERPRETER_BLOCK if _INTERPRETING else compiled


def tile_rows(row: int, compiled_tile: int) -> tuple[int, int]:
    """``(row_block, rows)`` for a kernel holding whole rows of ``row`` elements: the row
    padded to a power of two, and how many such rows fill a tile of
    ``block(compiled_tile)`` elements (at least one)."""
    row_block = next_power_of_2(row)
    return row_block, max(1, block(compiled_tile) // row_block)


def num_warps(elements: int) -> int:
    """Warps for a program over ``elements`` elements: 4 up to 4096, 8 up to 16384, 16
    above (the interpreter ignores it)."""
    return 4 if elements <= 4096 else 8 if elements <= 16384 else 16


def grid(n: int, per_program: int) -> tuple[int]:
    """One program per ``per_program`` of ``n`` units (elements, rows, blocks), the last
    one partial."""
    return (cdiv(n, per_program),)


def max_programs(device: torch.device) -> int:
    """How many programs a persistent kernel launches: four per streaming multiprocessor on
    a GPU, a few under the interpreter (which runs them one after another)."""
    if device.type == "cuda" and not _INTERPRETING:
        return 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def persistent_programs(work: int, device: torch.device) -> int:
    """Programs for a persistent kernel with ``work`` units of work (blocks, tiles) on
    ``device``: one per unit, at most :func:`max_programs`, at least one."""
    return max(1, min(work, max_programs(device)))
