"""Blockwise quantization to int8 or fp8 (e4m3), one scale per block of consecutive
elements (128 by default: the fine-grained tiles of DeepSeek-V3's FP8 training).

``quantize_blockwise(x)`` returns ``(q, scales, nonfinite)``:

- ``q``: ``x``'s shape, ``torch.int8`` or ``torch.float8_e4m3fn``;
- ``scales``: float32, one per block of the flattened ``x`` (the last block may be
  short): the largest finite magnitude of the block over 127 (int8) or 448 (fp8); 1 for a
  block with no finite non-zero element, so nothing divides by zero;
- ``nonfinite``: int32, one per block: how many NaN or ±Inf elements the block holds.
  ``nonfinite.any()`` tells whether the tensor held any; the finite elements of such a
  block are still quantized against their own largest magnitude. The non-finite ones
  become 0 (NaN) and ±127 (±Inf) in int8, NaN in fp8 (e4m3 has no infinity).

Rounding is to nearest, ties to even, unless ``stochastic=True``: then up or down with
the probabilities that make the expected value exact (unbiased), drawn from ``seed``
(Philox in Triton, ``torch.Generator`` in the reference: the two agree in distribution,
not bit for bit). Round-trip error per element: at most scale/2 (int8) or half an e4m3
step, a relative 2^-4 for normal values (fp8); twice that with stochastic rounding.

fp8 rounding is computed in float32 arithmetic (to 3 mantissa bits at the value's
exponent, then clamped to ±448) so the final cast is exact: compiled Triton, the
interpreter and ``x.to(torch.float8_e4m3fn)`` agree bit for bit.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

import torch

from autotune.kernels import _launch
from autotune.kernels._launch import cast_rne, tl

__all__ = [
    "Format",
    "dequantize_blockwise",
    "dequantize_blockwise_reference",
    "quantize_blockwise",
    "quantize_blockwise_reference",
]

Format = Literal["int8", "fp8_e4m3"]

QMAX: Final[dict[str, float]] = {"int8": 127.0, "fp8_e4m3": 448.0}
QDTYPE: Final[dict[str, torch.dtype]] = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
_FLOATS: Final = (torch.float32, torch.bfloat16, torch.float16)
_TILE: Final = 4096  # compiled; see _launch.block
_NUM_WARPS: Final = _launch.num_warps(_TILE)  # of the compiled tile, whatever block_size
# 1.5 * 2**23: adding and subtracting it rounds |y| < 2**22 to an integer, ties to even.
_RNE_MAGIC: Final = _launch.constexpr(12582912.0)


def _check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, not {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, not {block_size}")


def _check_quantize(x: torch.Tensor, block_size: int, fmt: str, seed: int | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError("quantize_blockwise: x must be a tensor")
    if x.dtype not in _FLOATS:
        raise ValueError(f"quantize_blockwise: x dtype {x.dtype} is not float32/bfloat16/float16")
    _check_block_size(block_size)
    if fmt not in get_args(Format):
        raise ValueError(f"quantize_blockwise: fmt must be one of {get_args(Format)}, not {fmt!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"quantize_blockwise: seed must be an int or None, not {seed!r}")


def _check_dequantize(
    q: torch.Tensor, scales: torch.Tensor, block_size: int, out_dtype: torch.dtype
) -> None:
    if not isinstance(q, torch.Tensor) or not isinstance(scales, torch.Tensor):
        raise TypeError("dequantize_blockwise: q and scales must be tensors")
    if q.dtype not in QDTYPE.values():
        raise ValueError(f"dequantize_blockwise: q dtype {q.dtype} is not int8/float8_e4m3fn")
    _check_block_size(block_size)
    blocks = _launch.cdiv(q.numel(), block_size)
    if scales.dtype != torch.float32 or scales.shape != (blocks,):
        raise ValueError(
            f"dequantize_blockwise: scales must be float32 of shape ({blocks},) for "
            f"{q.numel()} elements in blocks of {block_size}, not {scales.dtype} "
            f"{tuple(scales.shape)}"
        )
    if scales.device != q.device:
        raise ValueError(f"dequantize_blockwise: scales on {scales.device}, q on {q.device}")
    if out_dtype not in _FLOATS:
        raise ValueError(
            f"dequantize_blockwise: out_dtype {out_dtype} is not float32/bfloat16/float16"
        )


def _draw_seed(seed: int | None) -> int:
    """The seed given, or one drawn from torch's default generator."""
    return int(torch.randint(0, 2**31 - 1, ())) if seed is None else seed


def quantize_blockwise_reference(
    x: torch.Tensor,
    block_size: int = 128,
    fmt: Format = "int8",
    stochastic: bool = False,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch ``quantize_blockwise``."""
    _check_quantize(x, block_size, fmt, seed)
    n = x.numel()
    blocks = _launch.cdiv(n, block_size)
    flat = x.reshape(-1).float()
    tiles = torch.nn.functional.pad(flat, (0, blocks * block_size - n)).view(blocks, block_size)
    finite = torch.isfinite(tiles)
    amax = torch.where(finite, tiles.abs(), 0.0).amax(dim=1)
    nonfinite = (~finite).sum(dim=1, dtype=torch.int32)
    # Divided by a tensor: by a Python number, CUDA multiplies by its reciprocal, which is
    # 1 ulp off the correctly rounded quotient the kernel computes.
    scales = torch.where(amax > 0, amax / torch.full_like(amax, QMAX[fmt]), 1.0)
    y = tiles / scales[:, None]
    noise = None
    if stochastic:
        generator = torch.Generator(device=x.device)
        generator.manual_seed(_draw_seed(seed))
        noise = torch.rand(y.shape, generator=generator, device=x.device)
    if fmt == "int8":
        rounded = torch.round(y) if noise is None else torch.floor(y + noise)
        rounded = torch.where(torch.isnan(y), 0.0, rounded.clamp(-127.0, 127.0))
    else:
        if noise is None:
            rounded = y.clamp(-448.0, 448.0)  # the cast rounds to nearest even
        else:
            magnitude = y.abs()
            _, exponent = torch.frexp(magnitude)  # magnitude in [2**(e-1), 2**e)
            step_exponent = torch.clamp(exponent - 1, min=-6) - 3
            steps = torch.floor(torch.ldexp(magnitude, -step_exponent) + noise)
            rounded = torch.copysign(torch.ldexp(steps, step_exponent), y).clamp(-448.0, 448.0)
        rounded = torch.where(torch.isfinite(y), rounded, torch.nan)
    q = rounded.to(QDTYPE[fmt]).view(-1)[:n].view(x.shape)
    return q, scales, nonfinite


def dequantize_blockwise_reference(
    q: torch.Tensor,
    scales: torch.Tensor,
    block_size: int = 128,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Pure-torch ``dequantize_blockwise``."""
    _check_dequantize(q, scales, block_size, out_dtype)
    n = q.numel()
    per_element = scales.repeat_interleave(block_size)[:n]
    return (q.reshape(-1).float() * per_element).to(out_dtype).view(q.shape)


@_launch.jit
def _quantize_kernel(
    x_ptr: tl.tensor,
    q_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    nonfinite_ptr: tl.tensor,
    n: tl.tensor,
    num_blocks: tl.tensor,
    seed: tl.tensor,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_P2: tl.constexpr,
    ROWS: tl.constexpr,
    FP8: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    HW_CAST: tl.constexpr,
) -> None:
    """ROWS quantization blocks per program, one per row of a [ROWS, BLOCK_P2] tile; q is
    written through an int8 view."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_P2)
    offs = rows[:, None] * BLOCK_SIZE + cols[None, :]
    mask = (rows[:, None] < num_blocks) & (cols[None, :] < BLOCK_SIZE) & (offs < n)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    magnitude = tl.abs(x)
    finite = magnitude < float("inf")  # false for NaN too
    amax = tl.max(tl.where(finite, magnitude, 0.0), axis=1)
    bad = tl.sum((mask & ~finite).to(tl.int32), axis=1)
    qmax = 448.0 if FP8 else 127.0
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, qmax), 1.0)
    y = tl.math.div_rn(x, scale[:, None])
    if STOCHASTIC:
        noise = tl.rand(seed, offs)
    if FP8 and HW_CAST and not STOCHASTIC:
        # Compiled for a GPU: the hardware's fp32 -> e4m3 conversion rounds to nearest
        # even (and keeps -0.0); saturate first, since the format has no infinity.
        y_finite = tl.abs(y) < float("inf")
        clamped = tl.minimum(tl.maximum(y, -448.0), 448.0)
        code = tl.where(y_finite, clamped, 0.0).to(tl.float8e4nv).to(tl.int8, bitcast=True)
        tl.store(q_ptr + offs, tl.where(y_finite, code, 0x7F).to(tl.int8), mask=mask)
    elif FP8:
        # Rounded by hand: the interpreter's cast is wrong at exponent carries, and
        # stochastic rounding needs the step anyway.
        ay = tl.abs(y)
        exponent = ((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        exponent = tl.minimum(tl.maximum(exponent, -6), 8)  # subnormal step below 2**-6
        up = ((130 - exponent) << 23).to(tl.float32, bitcast=True)  # 2**(3 - e)
        down = ((124 + exponent) << 23).to(tl.float32, bitcast=True)  # 2**(e - 3)
        steps = ay * up  # exact: a power of two
        steps = tl.math.floor(steps + noise) if STOCHASTIC else (steps + _RNE_MAGIC) - _RNE_MAGIC
        rounded = tl.minimum(steps * down, 448.0)
        # The sign of y, put on by its bit: -rounded is 0 - rounded in Triton, which
        # turns -0.0 into +0.0 (compiled; the interpreter keeps the sign).
        sign = y.to(tl.int32, bitcast=True) & -2147483648
        rounded = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
        y_finite = ay < float("inf")
        # The cast is exact; NaN is written as torch's code (0x7F): casting NaN is not
        # portable (the interpreter turns it into 384).
        code = tl.where(y_finite, rounded, 0.0).to(tl.float8e4nv).to(tl.int8, bitcast=True)
        tl.store(q_ptr + offs, tl.where(y_finite, code, 0x7F).to(tl.int8), mask=mask)
    else:
        rounded = tl.math.floor(y + noise) if STOCHASTIC else (y + _RNE_MAGIC) - _RNE_MAGIC
        rounded = tl.minimum(tl.maximum(rounded, -127.0), 127.0)
        rounded = tl.where(y != y, 0.0, rounded)
        tl.store(q_ptr + offs, rounded.to(tl.int8), mask=mask)
    row_mask = rows < num_blocks
    tl.store(scales_ptr + rows, scale, mask=row_mask)
    tl.store(nonfinite_ptr + rows, bad, mask=row_mask)


@_launch.jit
def _dequantize_kernel(
    q_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n: tl.tensor,
    BLOCK_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    FP8: tl.constexpr,
) -> None:
    """q is read through an int8 view; the fp8 NaN code (0x7F or 0xFF) is decoded here, as
    the interpreter does not."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    code = tl.load(q_ptr + offs, mask=mask, other=0)
    if FP8:
        q = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        q = tl.where((code & 0x7F) == 0x7F, float("nan"), q)
    else:
        q = code.to(tl.float32)
    scale = tl.load(scales_ptr + offs // BLOCK_SIZE, mask=mask, other=1.0)
    tl.store(out_ptr + offs, cast_rne(q * scale, out_ptr.dtype.element_ty), mask=mask)


def quantize_blockwise(
    x: torch.Tensor,
    block_size: int = 128,
    fmt: Format = "int8",
    stochastic: bool = False,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (float32, bfloat16 or float16, any shape) blockwise over its
    flattened elements; returns ``(q, scales, nonfinite)`` (see the module docstring).
    ``seed`` drives stochastic rounding (None: drawn from torch's default generator)."""
    _check_quantize(x, block_size, fmt, seed)
    used = _launch.resolve(x.device)
    _launch.record(used)
    if used == "reference":
        return quantize_blockwise_reference(x, block_size, fmt, stochastic, seed)
    n = x.numel()
    blocks = _launch.cdiv(n, block_size)
    q = torch.empty(x.shape, dtype=QDTYPE[fmt], device=x.device)
    scales = torch.empty(blocks, dtype=torch.float32, device=x.device)
    nonfinite = torch.empty(blocks, dtype=torch.int32, device=x.device)
    if n == 0:
        return q, scales, nonfinite
    block_p2, rows = _launch.tile_rows(block_size, _TILE)
    _quantize_kernel[_launch.grid(blocks, rows)](
        x.contiguous(), q.view(torch.int8), scales, nonfinite, n, blocks,
        _draw_seed(seed) if stochastic else 0,
        BLOCK_SIZE=block_size, BLOCK_P2=block_p2, ROWS=rows, FP8=fmt == "fp8_e4m3",
        STOCHASTIC=stochastic, HW_CAST=used == "triton", num_warps=_NUM_WARPS,
    )  # fmt: skip
    return q, scales, nonfinite


def dequantize_blockwise(
    q: torch.Tensor,
    scales: torch.Tensor,
    block_size: int = 128,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``q * scale`` of its block, in ``out_dtype`` (float32, bfloat16 or float16), in
    ``q``'s shape. ``q`` is int8 or float8_e4m3fn as ``quantize_blockwise`` made it."""
    _check_dequantize(q, scales, block_size, out_dtype)
    used = _launch.resolve(q.device)
    _launch.record(used)
    if used == "reference":
        return dequantize_blockwise_reference(q, scales, block_size, out_dtype)
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    n = q.numel()
    if n == 0:
        return out
    block = _launch.block(_TILE)
    _dequantize_kernel[_launch.grid(n, block)](
        q.contiguous().view(torch.int8), scales.contiguous(), out, n,
        BLOCK_SIZE=block_size, BLOCK=block, FP8=q.dtype == torch.float8_e4m3fn,
        num_warps=_NUM_WARPS,
    )  # fmt: skip
    return out
