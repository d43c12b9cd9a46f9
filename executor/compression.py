"""Gradient compression in the data-parallel reduction, with the bytes really sent.

The local gradients of a rank (tensor-parallel shards included) are flattened in
parameter order into one float32 buffer and reduced over the data-parallel group:

- ``none``: all-reduce of the buffer;
- ``topk:R``: ``topk_compress`` with error feedback keeps the largest ``R`` share of
  ``gradient + residual``; values (float32) and indices (int64) are all-gathered and
  summed back with ``scatter_add_decompress``;
- ``int8`` / ``fp8``: ``quantize_blockwise`` (one float32 scale per block of 128,
  stochastic rounding), all-gather of codes and scales, dequantize and sum;
- ``powersgd:RANK``: torch's PowerSGD communication hook on DDP (see ``worker``); its
  all-reduces are counted by ``count_powersgd_traffic``.

``bytes_sent`` is the payload a rank hands to the collectives in a step; ``bytes_dense``
what a dense float32 all-reduce of the same gradients would hand over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch._C._distributed_c10d import GradBucket

from autotune.core import CompressionSpec

__all__ = [
    "ByteCounter",
    "CountingAllReduce",
    "GradientReducer",
    "count_powersgd_traffic",
    "counting_allreduce_hook",
    "local_grad",
    "stop_counting_powersgd_traffic",
]


def local_grad(p: Tensor) -> Tensor | None:
    """The gradient's local part (a tensor-parallel shard's own block)."""
    g = p.grad
    if g is None:
        return None
    to_local = getattr(g, "to_local", None)
    return to_local() if to_local is not None else g


@dataclass
class ByteCounter:
    sent: int = 0
    dense: int = 0

    def take(self) -> tuple[int, int]:
        out = (self.sent, self.dense)
        self.sent = self.dense = 0
        return out


@dataclass
class GradientReducer:
    """Averages gradients over the data-parallel ``group`` as ``spec`` says."""

    spec: CompressionSpec
    group: Any
    size: int
    rank: int
    residual: Tensor | None = None
    counter: ByteCounter = field(default_factory=ByteCounter)

    def reduce(self, params: Sequence[Tensor], step: int) -> tuple[int, int]:
        """Average the gradients of ``params`` in place; returns (bytes sent, dense bytes)."""
        grads = [g for g in (local_grad(p) for p in params) if g is not None]
        if self.size == 1 or not grads:
            return 0, 0
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dense = flat.numel() * 4
        kind = self.spec.kind
        if kind == "none":
            dist.all_reduce(flat, group=self.group)
            sent = dense
        elif kind == "topk":
            flat, sent = self._topk(flat, step)
        elif kind in ("int8", "fp8"):
            flat, sent = self._quantized(flat, step, "int8" if kind == "int8" else "fp8_e4m3")
        else:
            raise ValueError(f"{kind} compression does not go through GradientReducer")
        flat.div_(self.size)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        return sent, dense

    def _topk(self, flat: Tensor, step: int) -> tuple[Tensor, int]:
        from autotune.kernels import scatter_add_decompress, topk_compress

        if self.residual is None or self.residual.numel() != flat.numel():
            self.residual = torch.zeros_like(flat)
        assert self.spec.ratio is not None
        values, indices = topk_compress(flat, self.residual, self.spec.ratio)
        gathered_values = [torch.empty_like(values) for _ in range(self.size)]
        gathered_indices = [torch.empty_like(indices) for _ in range(self.size)]
        dist.all_gather(gathered_values, values, group=self.group)
        dist.all_gather(gathered_indices, indices, group=self.group)
        out = torch.zeros_like(flat)
        scatter_add_decompress(torch.cat(gathered_values), torch.cat(gathered_indices), out)
        sent = values.numel() * values.element_size() + indices.numel() * indices.element_size()
        return out, sent

    def _quantized(self, flat: Tensor, step: int, fmt: str) -> tuple[Tensor, int]:
        from autotune.kernels import dequantize_blockwise, quantize_blockwise

        seed = (step * 9_973 + self.rank) % (2**31 - 1)
        q, scales, _ = quantize_blockwise(flat, 128, fmt, stochastic=True, seed=seed)  # type: ignore[arg-type]
        codes = q.view(torch.uint8)  # gloo has no float8 type; ship the bytes
        gathered_codes = [torch.empty_like(codes) for _ in range(self.size)]
        gathered_scales = [torch.empty_like(scales) for _ in range(self.size)]
        dist.all_gather(gathered_codes, codes, group=self.group)
        dist.all_gather(gathered_scales, scales, group=self.group)
        out = torch.zeros_like(flat)
        for c, s in zip(gathered_codes, gathered_scales, strict=True):
            out += dequantize_blockwise(c.view(q.dtype), s, 128, torch.float32)
        sent = codes.numel() + scales.numel() * scales.element_size()
        return out, sent


class _CountingDist:
    """``torch.distributed`` with ``all_reduce`` counting the bytes it is handed."""

    def __init__(self, counter: ByteCounter) -> None:
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def all_reduce(self, tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        self._counter.sent += tensor.numel() * tensor.element_size()
        return dist.all_reduce(tensor, *args, **kwargs)


def count_powersgd_traffic(counter: ByteCounter) -> None:
    """Make PowerSGD's hook count the bytes of every all-reduce it issues (P, Q and the
    tensors it leaves uncompressed) into ``counter``, in this process, including the plain
    all-reduces of its warm-up steps (``start_powerSGD_iter``), which go through
    ``default_hooks``. A worker process trains one job, so nothing else is counted."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    counting = _CountingDist(counter)
    powerSGD_hook.dist = counting  # type: ignore[assignment,attr-defined]
    default_hooks.dist = counting  # type: ignore[assignment,attr-defined]


def stop_counting_powersgd_traffic() -> None:
    """Undo ``count_powersgd_traffic`` (a process that trains another job next)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    powerSGD_hook.dist = dist  # type: ignore[attr-defined]
    default_hooks.dist = dist  # type: ignore[attr-defined]


@dataclass
class CountingAllReduce:
    """State of ``counting_allreduce_hook``: where to count, which group to reduce over."""

    counter: ByteCounter
    group: Any


def counting_allreduce_hook(
    state: CountingAllReduce, bucket: GradBucket
) -> torch.futures.Future[Tensor]:
    """DDP's own averaging all-reduce of a gradient bucket, counting the bytes it sends."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffer = bucket.buffer()
    state.counter.sent += buffer.numel() * buffer.element_size()
    return allreduce_hook(state.group, bucket)


# DDP checks a hook's annotations as objects; this module's are strings (PEP 563).
counting_allreduce_hook.__annotations__.update(
    bucket=GradBucket, state=CountingAllReduce, **{"return": torch.futures.Future[Tensor]}
)
