"""The job of a trace as submitted (``TraceJob``) and the model a job of a trace that
names none trains (``assign_model``).

Jobs of the Alibaba and Philly traces name no model; ``assign_model`` picks one from the
catalog by job size (``MODEL_TIERS``), the same one for the same job and seed.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Final

__all__ = ["MODEL_TIERS", "TraceJob", "assign_model"]


MODEL_TIERS: Final[tuple[tuple[int | None, tuple[str, ...]], ...]] = (
    (1, ("resnet-50", "bert-large", "gpt-125m")),
    (4, ("bert-large", "gpt-125m", "gpt-350m")),
    (8, ("gpt-350m", "gpt-1.3b")),
    (None, ("gpt-1.3b", "gpt-7b")),
)
"""Models a trace job without one may train, by size: ``(most GPUs, names)`` in order of
size, ``None`` for any larger job. A 1-GPU job trains a small model; 2-4 GPUs a
BERT/GPT of a few hundred million parameters; 5-8 GPUs (one node) up to 1.3 B; more
than a node up to 7 B. Every name is a key of ``autotune.catalog.profiles.MODEL_CATALOG``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One job of a trace, as submitted."""

    job_id: str
    submit_s: float
    """Seconds after the trace's first submission (the first job is at 0.0)."""
    num_gpus: int
    """GPUs the job asked for, >= 1."""
    duration_s: float | None
    """How long it ran in the trace at ``num_gpus``; ``None`` when the trace has no
    durations (Pollux jobs run until their work is done)."""
    model: str
    """A key of ``autotune.catalog.profiles.MODEL_CATALOG``, or a Pollux application name."""
    global_batch: int | None
    """Samples per optimizer step; ``None``: the model's default."""
    gpu_types: tuple[str, ...] | None = None
    """GPU models the job may run on (Alibaba ``gpu_spec``); ``None`` means any."""
    max_nodes: int | None = None
    """Most nodes the job may span (1 for an Alibaba pod); ``None`` means any."""

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> ValueError:
            return ValueError(f"TraceJob.{name}={getattr(self, name)!r}: {why}")

        if not isinstance(self.job_id, str) or not self.job_id:
            raise fail("job_id", "must be a non-empty string")
        if not math.isfinite(self.submit_s) or self.submit_s < 0:
            raise fail("submit_s", "must be a finite number >= 0")
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int):
            raise fail("num_gpus", "must be an integer")
        if self.num_gpus < 1:
            raise fail("num_gpus", "must be >= 1")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise fail("duration_s", "must be a finite number > 0, or None")
        if not isinstance(self.model, str) or not self.model:
            raise fail("model", "must be a non-empty string")
        if self.global_batch is not None and self.global_batch < 1:
            raise fail("global_batch", "must be >= 1, or None")
        if self.gpu_types is not None and not (self.gpu_types and all(self.gpu_types)):
            raise fail("gpu_types", "must be non-empty model names, or None")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise fail("max_nodes", "must be >= 1, or None")


def assign_model(job_id: str, num_gpus: int, seed: int) -> str:
    """A model of ``MODEL_TIERS`` for a job of ``num_gpus`` GPUs, picked by a hash of the
    seed and the job id: the same on every run and every machine."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus={num_gpus!r}: must be an integer >= 1")
    names = next(names for most, names in MODEL_TIERS if most is None or num_gpus <= most)
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=8).digest()
    return names[int.from_bytes(digest, "big") % len(names)]
