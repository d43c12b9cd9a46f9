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

Error feedback (top-k's residual, PowerSGD's error) is state a checkpoint keeps, keyed by
parameter name so that it does not depend on the flat buffer's or DDP bucket's order:
``GradientReducer.residual_parts`` / ``load_residual_parts`` and ``NamedPowerSGD``'s
``export`` / ``load``. ``int8`` and ``fp8`` have no error feedback (stochastic rounding
seeded by step and rank): they have no state.

**Adaptive top-k** (``AdaptiveTopk``, ``WorkerSpec.adaptive_topk``): the kept share moves
between steps along ``TOPK_LADDER`` with what the job measures, from the figures every
rank agreed (``autotune.executor.quality.agree``), so every rank keeps the same share and
the all-gather's sizes match. The residual does not depend on the ratio (it is what was
not sent, whatever was kept), so error feedback carries over a change unchanged.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import Tensor
from torch._C._distributed_c10d import GradBucket

from autotune.core import CompressionSpec
from autotune.executor.quality import Probe, Quality

__all__ = [
    "ADAPTIVE_REFERENCE_BUDGET",
    "EXPLORING_REFERENCE_BUDGET",
    "FIDELITY_FLOOR",
    "TOPK_LADDER",
    "AdaptiveTopk",
    "ByteCounter",
    "CountingAllReduce",
    "GradientReducer",
    "NamedPowerSGD",
    "ShareMeasured",
    "count_powersgd_traffic",
    "counting_allreduce_hook",
    "local_grad",
    "named_powersgd_hook",
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
    handed_at: float | None = None
    """``time.perf_counter()`` when DDP last handed a gradient bucket to its hook (the
    bucket's gradients were ready): what the backward pass does after the last one is
    waiting for the reductions, the synchronisation it did not hide."""
    probe: Probe | None = None
    """Where DDP's hooks measure this step's gradients (``autotune.executor.quality``);
    ``None``: they do not."""

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
    """Top-k's error feedback: what this rank has not sent yet, flat, over the gradients
    of ``slots``."""
    slots: tuple[int, ...] = ()
    """Indices (in ``params`` as ``reduce`` is given them) of the parameters whose local
    gradients ``residual`` covers, in order."""
    sizes: tuple[int, ...] = ()
    """Their local gradients' sizes."""
    pending: dict[int, Tensor] | None = None
    """Residual parts by parameter index, loaded from a checkpoint, for the next step."""
    counter: ByteCounter = field(default_factory=ByteCounter)

    def reduce(
        self, params: Sequence[Tensor], step: int, probe: Probe | None = None
    ) -> tuple[int, int]:
        """Average the gradients of ``params`` in place; returns (bytes sent, dense bytes).
        ``probe``: measure the local gradient there, and on a reference step compare the
        compressed average with the dense one through their sketches, and note the
        residual."""
        local = [local_grad(p) for p in params]
        slots = tuple(i for i, g in enumerate(local) if g is not None)
        grads = [g for g in local if g is not None]
        if self.size == 1 or not grads:
            return 0, 0
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        if self.spec.kind == "topk":
            self._align_residual(flat, slots, [g.numel() for g in grads])
        dense = flat.numel() * 4
        kind = self.spec.kind
        sketch: Tensor | None = None
        if probe is not None:
            probe.add_local(flat)
            if probe.reference and kind != "none":
                sketch = probe.reference_sketch(flat, self.group, self.size)
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
        if probe is not None:
            if sketch is not None:
                probe.compare(flat, sketch)
            if probe.reference and self.residual is not None:
                probe.residual_sq = torch.dot(self.residual, self.residual)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        return sent, dense

    def residual_parts(self, params: Sequence[Tensor]) -> dict[int, Tensor]:
        """The residual's part for each parameter it covers (by index in ``params``), in
        the shape of the parameter's local gradient; parts loaded and not used yet too."""
        if self.residual is None:
            return dict(self.pending or {})
        parts = self._parts()
        for i, part in parts.items():
            p = params[i]
            shape = p.to_local().shape if hasattr(p, "to_local") else p.shape
            parts[i] = part.view(shape)
        return parts

    def load_residual_parts(self, parts: dict[int, Tensor]) -> None:
        """Start the next step from these residual parts (by parameter index; a missing
        one is zero)."""
        self.residual, self.slots, self.sizes, self.pending = None, (), (), dict(parts)

    def _parts(self) -> dict[int, Tensor]:
        parts, offset = {}, 0
        assert self.residual is not None
        for i, n in zip(self.slots, self.sizes, strict=True):
            parts[i] = self.residual[offset : offset + n]
            offset += n
        return parts

    def _align_residual(self, flat: Tensor, slots: tuple[int, ...], sizes: list[int]) -> None:
        """Make ``residual`` cover ``slots``: kept as it is, or laid out anew when the
        parameters with a gradient changed or parts were loaded (zero where nothing is
        owed)."""
        if self.residual is not None and self.slots == slots:
            return
        source = self._parts() if self.residual is not None else (self.pending or {})
        residual = torch.zeros_like(flat)
        offset = 0
        for i, n in zip(slots, sizes, strict=True):
            part = source.get(i)
            if part is not None and part.numel() == n:
                residual[offset : offset + n] = part.reshape(-1).to(residual)
            offset += n
        self.residual, self.slots, self.sizes, self.pending = residual, slots, tuple(sizes), None

    def _topk(self, flat: Tensor, step: int) -> tuple[Tensor, int]:
        from autotune.kernels import scatter_add_decompress, topk_compress

        assert self.residual is not None
        assert self.residual.numel() == flat.numel()
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
    state.counter.handed_at = time.perf_counter()
    if state.counter.probe is not None:
        state.counter.probe.add_local(buffer)
    return allreduce_hook(state.group, bucket)


@dataclass(frozen=True)
class _Entry:
    """One gradient of a DDP bucket as PowerSGD treats it."""

    name: str
    offset: int
    """Start in the bucket's flat buffer (elements)."""
    shape: tuple[int, ...]
    low_rank: tuple[int, int, int] | None
    """``(n, m, r)`` when PowerSGD compresses it as an ``n x m`` matrix of rank ``r``."""


@dataclass
class NamedPowerSGD:
    """State of ``named_powersgd_hook``: torch's ``PowerSGDState`` and, per bucket, which
    parameter each stretch of its memories belongs to, so that the memories can be saved
    and restored by parameter name (independent of DDP's bucket order, which DDP
    rebuilds after the first step, and of the data-parallel degree).

    Torch's memories per bucket: ``error_dict`` (this rank's error feedback, over the
    bucket's flat buffer), ``p_memory_dict`` and ``q_memory_dict`` (the low-rank factors
    of the compressed gradients, grouped by matrix shape in order of first appearance,
    as ``powerSGD_hook`` lays them out; the same on every rank after its all-reduces;
    ``Q`` warm-starts the next step)."""

    state: Any
    names: dict[int, str]
    """``id(parameter)`` -> parameter name."""
    counter: ByteCounter | None = None
    """Where the hook notes when it was handed a bucket (``ByteCounter.handed_at``)."""
    layouts: dict[int, tuple[_Entry, ...]] = field(default_factory=dict)
    pending: dict[str, dict[str, Tensor]] | None = None
    """``{"error" | "p" | "q": {name: tensor}}`` loaded from a checkpoint, laid into each
    bucket the first time the hook sees it."""

    def layout(self, bucket: GradBucket) -> tuple[_Entry, ...]:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
            _should_compress,
        )

        buffer = bucket.buffer()
        base, size = buffer.data_ptr(), buffer.element_size()
        entries = []
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            n = g.shape[0] if g.dim() else 1
            m = g.numel() // n if n else 0
            rank = min(n, m, self.state.matrix_approximation_rank)
            compress = _should_compress(  # type: ignore[no-untyped-call]
                n, m, rank, self.state.min_compression_rate
            )[0]
            entries.append(
                _Entry(
                    name=self.names[id(p)],
                    offset=(g.data_ptr() - base) // size,
                    shape=tuple(g.shape),
                    low_rank=(n, m, rank) if compress else None,
                )
            )
        return tuple(entries)

    @staticmethod
    def _factor_slices(layout: tuple[_Entry, ...]) -> dict[str, tuple[slice, slice]]:
        """Each compressed gradient's stretch of the P and Q memories."""
        groups: dict[tuple[int, int], list[_Entry]] = {}
        for entry in layout:
            if entry.low_rank is not None:
                groups.setdefault(entry.low_rank[:2], []).append(entry)
        out, p_at, q_at = {}, 0, 0
        for entries in groups.values():
            for entry in entries:
                assert entry.low_rank is not None
                n, m, r = entry.low_rank
                out[entry.name] = (slice(p_at, p_at + n * r), slice(q_at, q_at + m * r))
                p_at, q_at = p_at + n * r, q_at + m * r
        return out

    def _export_bucket(
        self, index: int, layout: tuple[_Entry, ...]
    ) -> dict[str, dict[str, Tensor]]:
        out: dict[str, dict[str, Tensor]] = {"error": {}, "p": {}, "q": {}}
        error = self.state.error_dict.get(index)
        if error is not None:
            for entry in layout:
                numel = math.prod(entry.shape)
                part = error[entry.offset : entry.offset + numel].view(entry.shape)
                out["error"][entry.name] = part.detach().clone()
        p_memory = self.state.p_memory_dict.get(index)
        q_memory = self.state.q_memory_dict.get(index)
        if p_memory is not None and q_memory is not None:
            for name, (ps, qs) in self._factor_slices(layout).items():
                out["p"][name] = p_memory[ps].detach().clone()
                out["q"][name] = q_memory[qs].detach().clone()
        return out

    def _import_bucket(
        self,
        index: int,
        layout: tuple[_Entry, ...],
        saved: dict[str, dict[str, Tensor]],
        buffer: Tensor,
    ) -> None:
        errors = saved.get("error", {})
        if any(entry.name in errors for entry in layout):
            error = torch.zeros_like(buffer)
            for entry in layout:
                part = errors.get(entry.name)
                numel = math.prod(entry.shape)
                if part is not None and part.numel() == numel:
                    error[entry.offset : entry.offset + numel] = part.reshape(-1).to(error)
            self.state.error_dict[index] = error
        else:
            self.state.error_dict.pop(index, None)
        slices = self._factor_slices(layout)
        ps, qs = saved.get("p", {}), saved.get("q", {})
        whole = slices and all(
            name in ps
            and name in qs
            and ps[name].numel() == s[0].stop - s[0].start
            and qs[name].numel() == s[1].stop - s[1].start
            for name, s in slices.items()
        )
        if whole:
            p_size = max(s[0].stop for s in slices.values())
            q_size = max(s[1].stop for s in slices.values())
            p_memory = buffer.new_empty(p_size)
            q_memory = buffer.new_empty(q_size)
            for name, (p_slice, q_slice) in slices.items():
                p_memory[p_slice] = ps[name].reshape(-1).to(p_memory)
                q_memory[q_slice] = qs[name].reshape(-1).to(q_memory)
            self.state.p_memory_dict[index] = p_memory
            self.state.q_memory_dict[index] = q_memory
        else:  # torch draws new factors (from its seeded generator)
            self.state.p_memory_dict.pop(index, None)
            self.state.q_memory_dict.pop(index, None)

    def export(self) -> dict[str, Any]:
        """``{"error": {name: tensor}, "p": ..., "q": ..., "iter", "rng", "rank"}``:
        this rank's error feedback, the (rank-independent) factors, torch's step counter
        and generator state."""
        out: dict[str, Any] = {"error": {}, "p": {}, "q": {}}
        for index, layout in self.layouts.items():
            for key, values in self._export_bucket(index, layout).items():
                out[key].update(values)
        if self.pending is not None:  # loaded, not laid into a bucket yet
            for key, values in self.pending.items():
                for name, value in values.items():
                    out[key].setdefault(name, value)
        out.update(
            iter=int(self.state.iter),
            rng=self.state.rng.get_state(),
            rank=int(self.state.matrix_approximation_rank),
        )
        return out

    def load(self, saved: dict[str, Any], error: dict[str, Tensor]) -> None:
        """Restore what ``export`` gave (``error``: this rank's error feedback, which may
        be another rank's or a mean; factors of another rank are dropped)."""
        same_rank = saved.get("rank") == self.state.matrix_approximation_rank
        self.pending = {
            "error": dict(error),
            "p": dict(saved.get("p", {})) if same_rank else {},
            "q": dict(saved.get("q", {})) if same_rank else {},
        }
        if "iter" in saved:
            self.state.iter = int(saved["iter"])
        if saved.get("rng") is not None:
            self.state.rng.set_state(saved["rng"])
        self.state.error_dict.clear()
        self.state.p_memory_dict.clear()
        self.state.q_memory_dict.clear()
        self.layouts.clear()


def named_powersgd_hook(state: NamedPowerSGD, bucket: GradBucket) -> torch.futures.Future[Tensor]:
    """Torch's ``powerSGD_hook``, with its memories re-laid by parameter name when a
    bucket's layout changes (DDP rebuilds its buckets after the first step) and loaded
    from ``state.pending`` the first time a bucket is seen."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if state.counter is not None:
        state.counter.handed_at = time.perf_counter()
    index = bucket.index()
    layout = state.layout(bucket)
    previous = state.layouts.get(index)
    if previous is not None and previous != layout:
        state._import_bucket(index, layout, state._export_bucket(index, previous), bucket.buffer())
    elif previous is None and state.pending is not None:
        state._import_bucket(index, layout, state.pending, bucket.buffer())
    state.layouts[index] = layout
    probe = state.counter.probe if state.counter is not None else None
    if probe is None:
        return powerSGD_hook.powerSGD_hook(state.state, bucket)
    buffer = bucket.buffer()
    probe.add_local(buffer)  # before the hook adds the error feedback into it
    if not probe.reference:
        return powerSGD_hook.powerSGD_hook(state.state, bucket)
    group = state.state.process_group
    size = group.size() if group is not None else dist.get_world_size()
    sketch = probe.reference_sketch(buffer, group, size, part=index)

    def compare(future: torch.futures.Future[Tensor]) -> Tensor:
        averaged = future.value()
        probe.compare(averaged, sketch, part=index)
        return averaged

    return powerSGD_hook.powerSGD_hook(state.state, bucket).then(compare)


# DDP checks a hook's annotations as objects; this module's are strings (PEP 563).
counting_allreduce_hook.__annotations__.update(
    bucket=GradBucket, state=CountingAllReduce, **{"return": torch.futures.Future[Tensor]}
)
named_powersgd_hook.__annotations__.update(
    bucket=GradBucket, state=NamedPowerSGD, **{"return": torch.futures.Future[Tensor]}
)


TOPK_LADDER: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
"""The kept shares adaptive top-k moves along, one rung at a time: from 0.1% to 20% (at
20% the values and int64 indices of 2 ranks already weigh 60% of a dense float32
all-reduce's bytes)."""
FIDELITY_FLOOR: Final = 0.6
"""Cosine of the compressed to the dense average below which adaptive top-k keeps more
(mlp-synthetic on 2 ranks: cosine 0.45 at 0.1%, and its loss after 60 steps 1.45 against
0.77 at 1%, cosine 0.4-0.7, and 0.76 at 10%, cosine 0.9)."""
TIME_TOLERANCE: Final = 0.05
"""Step time within which two shares count as equally fast: adaptive top-k keeps the
larger (the more faithful) of them."""
MIN_STEPS: Final = 8
"""Steps a share is timed on before adaptive top-k judges it."""
MIN_REFERENCES: Final = 2
"""Reference steps (cosines) a share is measured on before adaptive top-k judges it."""
ADAPTIVE_REFERENCE_BUDGET: Final = 0.05
"""Share of the step an adaptive top-k job's reference steps may cost once it settled on
a share (a fixed job's: ``autotune.executor.quality.REFERENCE_BUDGET``)."""
EXPLORING_REFERENCE_BUDGET: Final = 0.2
"""... and while it judges a share it has just moved to: it needs ``MIN_REFERENCES`` of
them there, and on mlp-synthetic (a reference costs about 70% of its 10 ms step) 5%
spaced them 14 steps apart, so that trying four shares took 117 steps."""


@dataclass(frozen=True, slots=True)
class ShareMeasured:
    """What adaptive top-k measured at one kept share: medians over its steps."""

    step_s: float
    cosine: float
    sync_share: float
    """The gradient reduction's share of the step (waiting for slower ranks included)."""


@dataclass
class AdaptiveTopk:
    """Top-k's kept share, moved one rung of ``ladder`` (within ``[low, high]``) at a
    time to the fastest step whose compressed average stays faithful to the dense one.

    It times each share it tries (the median step over ``min_steps`` steps, the same
    figure on every rank: ``Quality.step_s``) and measures its fidelity (the median cosine
    of the compressed to the dense average over ``min_references`` reference steps). Then:

    - cosine below ``floor``: keep more (one rung up); this share and those below it are
      not tried again;
    - else, while the rung below was not tried and is not known to be unfaithful, try it
      where the reduction takes more than ``tolerance`` of the step (keeping less cannot
      save more time than the reduction takes) and the last step down, if any, made the
      step faster by more than ``tolerance`` (on gpt-char over four 100 Mbit/s machines,
      1% to 0.5% saved 12% of the step, 0.5% to 0.2% 1.5%, and 0.1-0.2% took more steps
      to the target than 0.5%);
    - else go one rung towards the largest faithful share whose step is within
      ``tolerance`` of the fastest faithful one measured; where that is the current share
      and the rung above was not tried, try it (fidelity that costs no time: a job bound
      by latency or computation sends 10x more at the same step time). A share left for
      a faster one is not returned to: two neighbours' steps often differ by less than
      this host's noise, and a job went back and forth between them eight times in 170
      steps.

    Once it kept a share (judged it and stayed), only a cosine under the floor moves it
    again: a later median a little slower than the fastest one measured is more likely
    noise (the fastest of several noisy medians is biased low) than a change.

    Decisions come only from figures the ranks agreed, so every rank keeps the same share
    and the all-gather's sizes match."""

    ratio: float
    low: float = TOPK_LADDER[0]
    high: float = TOPK_LADDER[-1]
    floor: float = FIDELITY_FLOOR
    tolerance: float = TIME_TOLERANCE
    min_steps: int = MIN_STEPS
    min_references: int = MIN_REFERENCES
    ladder: tuple[float, ...] = TOPK_LADDER
    measured: dict[float, ShareMeasured] = field(default_factory=dict)
    unfaithful: float = 0.0
    """The largest share whose cosine fell below the floor (none: 0)."""
    step_times: list[float] = field(default_factory=list)
    """This share's step times so far."""
    sync_times: list[float] = field(default_factory=list)
    """This share's reduction times so far."""
    cosines: list[float] = field(default_factory=list)
    """This share's cosines so far (reference steps)."""
    settled: bool = False
    """Whether the current share was judged and kept (``False`` after each move)."""
    slower: set[float] = field(default_factory=set)
    """Shares left for a faster one: not returned to (their step times are within the
    host's noise of their neighbours', and going back and forth costs)."""

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high < 1:
            raise ValueError(
                f"adaptive top-k limits must satisfy 0 < low <= high < 1, got "
                f"[{self.low}, {self.high}]"
            )
        if not 0 < self.ratio < 1:
            raise ValueError(f"top-k ratio must be in (0, 1), got {self.ratio}")

    @property
    def rungs(self) -> list[float]:
        """The ladder's shares within the limits, and the current one if off the ladder."""
        inside = {r for r in self.ladder if self.low <= r <= self.high}
        return sorted(inside | {self.ratio})

    def observe(self, quality: Quality) -> tuple[float, str] | None:
        """Feed one step's agreed figures; returns ``(new share, why)`` when the share
        moves (the caller applies it from the next step), else ``None``."""
        if quality.step_s > 0:
            self.step_times.append(quality.step_s)
            self.sync_times.append(quality.sync_s)
        if quality.cosine is not None and math.isfinite(quality.cosine):
            self.cosines.append(quality.cosine)
        if len(self.step_times) < self.min_steps or len(self.cosines) < self.min_references:
            return None
        window = 4 * self.min_steps  # recent figures: a link can change under a job
        step_s = statistics.median(self.step_times[-window:])
        here = ShareMeasured(
            step_s,
            statistics.median(self.cosines[-window:]),
            min(1.0, statistics.median(self.sync_times[-window:]) / step_s),
        )
        self.measured[self.ratio] = here
        move = self._decide(here)
        self.settled = move is None
        if move is not None:
            self.ratio = move[0]
            self.step_times.clear()
            self.sync_times.clear()
            self.cosines.clear()
        return move

    def _decide(self, here: ShareMeasured) -> tuple[float, str] | None:
        rungs = self.rungs
        i = rungs.index(self.ratio)
        up = rungs[i + 1] if i + 1 < len(rungs) else None
        down = rungs[i - 1] if i > 0 else None
        figures = (
            f"{self.ratio:g} kept: step {here.step_s * 1e3:.0f} ms, reduction "
            f"{here.sync_share:.0%} of it, cosine {here.cosine:.2f}"
        )
        if here.cosine < self.floor:
            self.unfaithful = max(self.unfaithful, self.ratio)
            if up is None:
                return None
            return up, f"{figures}, below the floor of {self.floor}: keep more"
        if self.settled:
            return None
        above = self.measured.get(up) if up is not None else None
        if (
            down is not None
            and down > self.unfaithful
            and down not in self.measured
            and here.sync_share > self.tolerance
            and (above is None or above.step_s > here.step_s * (1 + self.tolerance))
        ):
            return down, f"{figures}: try keeping less"
        faithful = {r: m for r, m in self.measured.items() if r > self.unfaithful and r in rungs}
        if not faithful:
            return None
        fastest = min(m.step_s for m in faithful.values())
        target = max(r for r, m in faithful.items() if m.step_s <= fastest * (1 + self.tolerance))
        if target == self.ratio and up is not None and up not in self.measured:
            return up, f"{figures}, as fast as any: try keeping more"
        if target > self.ratio and up is not None and up not in self.slower:
            return up, f"{figures}; {target:g} is as fast and more faithful: keep more"
        if target < self.ratio and down is not None:
            self.slower.add(self.ratio)
            return down, f"{figures}; {target:g} is faster: keep less"
        return None
