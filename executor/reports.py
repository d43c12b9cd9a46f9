"""What a rank reports after each training step (``RankStep``), and the events of many
reports each once, as the job records them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autotune.executor.quality import Quality

__all__ = ["RankStep", "distinct_events", "job_loss"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStep:
    """One rank's report of one training step (``RankWorker.step``); the runner joins
    the ranks' reports into the job's ``JobMetrics``."""

    rank: int
    """The reporting rank."""
    step: int
    """Steps this rank has completed, this one included."""
    loss: float | None
    """The step's training loss (mean over its micro-batches); reported by one rank per
    data-parallel replica (the last pipeline stage's first tensor-parallel rank), ``None``
    on the others."""
    samples: int | None
    """Samples this rank's replica trained in the step, counted from its batch; reported
    by one rank per replica (the first stage's first tensor-parallel rank: its peers see
    the same samples), ``None`` on the others and where the batch cannot be counted."""
    step_time_s: float
    """Seconds the step took on this rank (forward, backward, reduction, optimizer)."""
    compute_time_s: float | None = None
    """Seconds from the step's start until this rank's gradients were ready (forward and
    backward; under DDP until backward handed over its last bucket): the rank's own
    speed, without the time it waited for slower peers (``autotune.executor.balance``).
    ``None`` where not measured."""
    sync_time_s: float | None
    """Seconds of the step this rank spent synchronising gradients across data-parallel
    ranks that it did not hide behind computation: under DDP (dense, PowerSGD) from the
    moment backward handed over its last gradient bucket to the end of backward; for
    top-k, int8 and fp8 the whole reduction after backward, compression included.
    ``None`` without data parallelism and on a skipped step."""
    bytes_sent: int
    """Bytes of gradients this rank sent to reduce them across data-parallel ranks, as
    compressed; 0 on a step skipped for a non-finite value."""
    bytes_dense: int
    """Bytes the same reduction sends uncompressed (fp32 gradients): the reference for
    the compression ratio; 0 where the rank reduces nothing."""
    events: tuple[dict[str, Any], ...]
    """What happened in the step (``nonfinite``, ``grad_overflow``) and, on the first
    step after a restore, what the restore did (``compression_state_*``); each a dict
    with ``step`` and ``kind``."""
    peak_memory_bytes: int
    """Peak memory of the rank so far, in bytes: allocated GPU memory on ``cuda``, the
    process's resident set on ``cpu``."""
    power_watts: float | None
    """Power draw of the rank's GPU after the step, in watts (NVML); ``None`` on CPU or
    without NVML."""
    fp8_mode: str | None
    """How fp8 ``nn.Linear`` layers multiplied (``scaled_mm`` or ``emulated``); ``None``
    where no class runs in fp8."""
    quality: Quality | None = None
    """The step's gradient figures (noise, fidelity, class norms), the same on every
    rank; ``None`` on a skipped step."""
    loss_scale: float | None = None
    """fp16's dynamic loss scale after the step; ``None`` without fp16."""


def distinct_events(reports: Iterable[RankStep]) -> list[dict[str, Any]]:
    """The events of ``reports``, each once, in the order first reported: every rank
    reports the events the ranks agreed on (a precision fall-back), so an event is known
    by its step, kind and module class."""
    seen: set[tuple[Any, Any, Any]] = set()
    out = []
    for report in reports:
        for event in report.events:
            key = (event["step"], event["kind"], event.get("module_class"))
            if key not in seen:
                seen.add(key)
                out.append(event)
    return out


def job_loss(reports: Iterable[RankStep]) -> float | None:
    """The step's loss over the global batch: the replicas' losses weighted by their
    samples where every replica that reports a loss counted its samples (a
    data-parallel-only layout, where batch shares may be uneven), else their mean.
    ``None`` where no rank reported one."""
    reported = [r for r in reports if r.loss is not None]
    if not reported:
        return None
    if all(r.samples for r in reported):
        total = sum(r.samples or 0 for r in reported)
        return sum((r.loss or 0.0) * (r.samples or 0) for r in reported) / total
    return sum(r.loss or 0.0 for r in reported) / len(reported)
