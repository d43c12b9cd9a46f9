"""Decompression of top-k gradients: ``out[indices] += values``, duplicates summed.

Gradients gathered from several ranks carry the same index more than once; every copy
is added. The sum is accumulated in float32 whatever ``out``'s dtype: a bfloat16 or
float16 ``out`` is widened, receives every value, and is rounded once at the end (the
reference does the same, so only the order of float32 additions differs between the two:
the Triton path adds with atomics, in no fixed order).
"""

from __future__ import annotations

from typing import Final

import torch

from autotune.kernels import _launch
from autotune.kernels._launch import tl

__all__ = ["scatter_add_decompress", "scatter_add_decompress_reference"]

_FLOATS: Final = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK: Final = 1024  # compiled; see _launch.block
_NUM_WARPS: Final = _launch.num_warps(_BLOCK)


def _check(values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (values, indices, out)):
        raise TypeError("scatter_add_decompress: values, indices and out must be tensors")
    if out.dtype not in _FLOATS:
        raise ValueError(
            f"scatter_add_decompress: out dtype {out.dtype} is not float32/bfloat16/float16"
        )
    if values.dtype != out.dtype:
        raise ValueError(f"scatter_add_decompress: values are {values.dtype}, out is {out.dtype}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"scatter_add_decompress: indices must be int64 or int32, not {indices.dtype}"
        )
    if values.dim() != 1 or indices.dim() != 1 or values.numel() != indices.numel():
        raise ValueError(
            "scatter_add_decompress: values and indices must be 1-D of one length, not "
            f"{tuple(values.shape)} and {tuple(indices.shape)}"
        )
    if not values.device == indices.device == out.device:
        raise ValueError(
            f"scatter_add_decompress: values on {values.device}, indices on {indices.device}, "
            f"out on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("scatter_add_decompress: out must be contiguous (it is updated in place)")
    if indices.numel():
        low, high = (int(v) for v in torch.aminmax(indices))
        if low < 0 or high >= out.numel():
            raise ValueError(
                f"scatter_add_decompress: indices span [{low}, {high}], outside "
                f"[0, {out.numel() - 1}] of out's {out.numel()} elements"
            )


def scatter_add_decompress_reference(
    values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Pure-torch ``scatter_add_decompress`` (``index_add_`` in float32)."""
    _check(values, indices, out)
    flat = out.view(-1)
    if out.dtype == torch.float32:
        flat.index_add_(0, indices, values)
    else:
        wide = flat.float()
        wide.index_add_(0, indices, values.float())
        flat.copy_(wide)
    return out


@_launch.jit
def _scatter_add_kernel(
    values_ptr: tl.tensor,
    indices_ptr: tl.tensor,
    acc_ptr: tl.tensor,
    k: tl.tensor,
    BLOCK: tl.constexpr,
) -> None:
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < k
    index = tl.load(indices_ptr + offs, mask=mask, other=0).to(tl.int64)
    value = tl.load(values_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.atomic_add(acc_ptr + index, value, mask=mask, sem="relaxed")


def scatter_add_decompress(
    values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Add ``values`` into the flattened ``out`` at ``indices``, in place; returns ``out``.

    Args:
        values: 1-D, ``out``'s dtype (float32, bfloat16 or float16).
        indices: 1-D int64 or int32 flat positions in ``out``, as many as ``values``;
            repeats are summed. Out-of-range indices raise ``ValueError`` (checking them
            waits for the device).
        out: contiguous, any shape; the sum is accumulated in float32.
    """
    _check(values, indices, out)
    used = _launch.resolve(out.device)
    _launch.record(used)
    if used == "reference":
        return scatter_add_decompress_reference(values, indices, out)
    k = values.numel()
    if k == 0:
        return out
    flat = out.view(-1)
    acc = flat if out.dtype == torch.float32 else flat.float()
    block = _launch.block(_BLOCK)
    _scatter_add_kernel[_launch.grid(k, block)](
        values.contiguous(), indices.contiguous(), acc, k, BLOCK=block, num_warps=_NUM_WARPS
    )
    if acc is not flat:
        flat.copy_(acc)
    return out
