"""A job's training quality, measured while it trains: the gradient noise scale, the
fidelity of a compressed reduction against the dense one, the error-feedback residual,
and each module class's gradient norm (the guard that raises a class's precision when its
gradients grow too fast).

Each rank measures in every step what it can see locally (``Probe``): the squared norm of
its own gradient before the reduction, and, on *reference* steps of a compressed job,
the dense average of its gradient's sketch beside the compressed average. After the
reduction the ranks sum their figures in one small all-reduce, so every rank holds the
job's (``Quality``); the runner turns them into the job's gradient noise
scale (``NoiseScale``).

- **Gradient noise scale** (McCandlish et al. 2018, as Pollux measures it online: Qiao et
  al., OSDI'21, section 3.1). With ``n`` replicas of ``b`` samples each (``B = n b``),
  E|g_i|^2 = |G|^2 + tr(S)/b for a replica's gradient and E|g|^2 = |G|^2 + tr(S)/B for the
  average, so |G|^2 = (B|g|^2 - b mean|g_i|^2)/(B - b) and tr(S) = (mean|g_i|^2 -
  |g|^2)/(1/b - 1/B), each smoothed by an exponential average; the noise scale is their
  ratio, in samples. It needs the dense average: exact on every step of an uncompressed
  job, estimated from the reference steps' sketches on a compressed one. Plain
  gradients, not Adam's preconditioned ones.
- **Compression fidelity** (reference steps): the cosine between the compressed average
  ``c`` the optimizer applies and the dense average ``d``, and the relative error
  |c - d| / |d|. The dense average is never formed: every rank sketches its gradient
  (``count_sketch``, ``SKETCH_SIZE`` buckets, the same hash on every rank) and the
  sketches are averaged, which is the sketch of ``d``; ``c`` is sketched alike and the
  norms and the inner product come from the sketches (unbiased, about 2% off).
- **Reference steps** cost one all-reduce of the sketch. They come as often as
  ``REFERENCE_BUDGET`` of the step time allows: after each, the next is
  ``ceil(cost / (budget x step))`` steps on (at least 1), from figures the ranks agreed in
  the all-reduce, so every rank takes the same steps as reference steps.
- **Learning rate at a larger batch** (``BatchScaling``): a job trained at a batch above
  the one its learning rate was tuned for steps at the learning rate times the batch's
  gain (AdaScale, Johnson et al. 2020, as Pollux applies it), from the noise scale its
  ranks measure, so that a step makes the progress the performance model credits it
  with (``autotune.perf.model.batch_gain``).
- **Gradient-norm guard**: a module class in fp16 or fp8 (the formats whose range
  overflows) whose gradient norm grew by more than ``GROWTH`` (25%) on ``GROWTH_STEPS``
  (3) steps in a row moves one step safer (``autotune.executor.precision.SAFER``), beside
  the fall-back on non-finite values.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import Tensor

from autotune.perf.model import batch_gain

__all__ = [
    "GROWTH",
    "GROWTH_STEPS",
    "GUARDED",
    "NOISE_MIN_MEASUREMENTS",
    "REFERENCE_BUDGET",
    "SKETCH_SIZE",
    "BatchScaling",
    "NoiseScale",
    "NormGuard",
    "Probe",
    "Quality",
    "ReferenceSchedule",
    "agree",
    "count_sketch",
    "sketch_key",
]

REFERENCE_BUDGET: Final = 0.01
"""Share of the step time reference steps may cost on average."""
SKETCH_SIZE: Final = 4096
"""Buckets of a reference step's CountSketch: 16 KiB all-reduced, estimates within about
sqrt(2 / 4096) = 2% of the norms they sketch."""
_PRIME: Final = 2**31 - 1
_CHUNK: Final = 1 << 22
GROWTH: Final = 1.25
GROWTH_STEPS: Final = 3
GUARDED: Final = frozenset({"fp16", "fp8"})
"""Formats the gradient-norm guard watches: those whose range overflows (fp16's largest
finite value is 65,504, e4m3's 448). bf16 has fp32's range: growth does not overflow it,
and on gpt-char in bf16 the guard would move attention and embeddings to fp32 in a
healthy run (twice in 150 steps, measured)."""
NOISE_SMOOTHING: Final = 0.9
"""Weight of the past in the noise scale's exponential averages, per step."""
NOISE_MIN_MEASUREMENTS: Final = 8
"""Measurements before a job reports its noise scale (``JobMetrics.noise_scale``)."""


def count_sketch(x: Tensor, key: int, size: int = SKETCH_SIZE) -> Tensor:
    """CountSketch of ``x`` (Charikar et al. 2002) into ``size`` buckets: each coordinate
    is added, with a random sign, to one bucket, both drawn from a hash seeded by ``key``
    (the same on every rank for the same key). Linear, so the sketch of an average is the
    average of the sketches, and unbiased for inner products: E<S x, S y> = <x, y>, with a
    variance of at most (|x|^2 |y|^2 + <x, y>^2) / size whatever the coordinates'
    distribution (heavy tails included, where sampling coordinates fails). ``x`` itself
    where it has no more than ``size`` elements (exact)."""
    flat = x.detach().reshape(-1).float()
    n = flat.numel()
    if n <= size:
        return flat.clone()
    generator = torch.Generator().manual_seed(key % (2**63 - 1))
    a, b = (int(v) for v in torch.randint(1, _PRIME, (2,), generator=generator))
    out = torch.zeros(size, device=flat.device)
    for begin in range(0, n, _CHUNK):  # bounded scratch memory on large models
        part = flat[begin : begin + _CHUNK]
        index = torch.arange(begin, begin + part.numel(), device=flat.device, dtype=torch.int64)
        hashed = (index * a + b) % _PRIME
        sign = (hashed // size % 2).float().mul_(2).sub_(1)
        out.index_add_(0, hashed % size, part * sign)
    return out


def sketch_key(seed: int, step: int, part: int = 0) -> int:
    """The hash seed of a reference step's sketch of one gradient part (a DDP bucket)."""
    return (seed * 1_000_003 + step) * 1_009 + part


@dataclass
class Probe:
    """What one rank measured of its gradients in one step, before the ranks agree
    (``agree``). Squared norms are of the loss-scaled gradients."""

    reference: bool = False
    """Whether this step compares the compressed reduction with a dense one."""
    seed: int = 0
    step: int = 0
    local_sq: Tensor | float = 0.0
    """|g_i|^2 of this rank's gradient (its local part) before the reduction."""
    dot: Tensor | float = 0.0
    """<c, d> of the compressed and the dense average, from their sketches (reference
    steps)."""
    compressed_sq: Tensor | float = 0.0
    """|c|^2 from its sketch (reference steps)."""
    dense_sq: Tensor | float = 0.0
    """|d|^2 from its sketch (reference steps)."""
    spread_sq: Tensor | float = 0.0
    """|g_i - d|^2, this rank's distance from the dense average, from the sketches
    (reference steps). Its mean over the ranks is mean |g_i|^2 - |d|^2 exactly, the
    difference the noise scale rests on: estimated directly it is about 2% off itself,
    where |d|^2 from its sketch would be 2% off |d|^2, often more than the difference."""
    reference_s: float = 0.0
    """Seconds the reference's dense all-reduce took."""
    spent_s: float = 0.0
    """Seconds this rank spent measuring in the step (the overhead), the reference
    included."""
    residual_sq: Tensor | float = 0.0
    """|r_i|^2 of this rank's error-feedback residual after the step."""

    def add_local(self, flat: Tensor) -> None:
        began = time.perf_counter()
        flat = flat.detach().float()
        self.local_sq = self.local_sq + torch.dot(flat, flat)
        self.spent_s += time.perf_counter() - began

    def reference_sketch(self, flat: Tensor, group: Any, size: int, part: int = 0) -> Tensor:
        """The sketch of ``flat``'s dense average over ``group`` (``size`` ranks): each
        rank's sketch all-reduced, timed into ``reference_s``. Adds to ``spread_sq`` this
        rank's |S g_i - S d|^2."""
        began = time.perf_counter()
        own = count_sketch(flat, sketch_key(self.seed, self.step, part))
        mean = own.clone()
        dist.all_reduce(mean, group=group)
        mean.div_(size)
        self.spread_sq = self.spread_sq + torch.dot(own - mean, own - mean)
        spent = time.perf_counter() - began
        self.reference_s += spent
        self.spent_s += spent
        return mean

    def compare(self, averaged: Tensor, dense: Tensor, part: int = 0) -> None:
        """Account the compressed average ``averaged`` against the sketch ``dense`` of the
        dense one, both sketched alike (so the cosine stays within [-1, 1])."""
        began = time.perf_counter()
        c = count_sketch(averaged, sketch_key(self.seed, self.step, part), dense.numel())
        self.dot = self.dot + torch.dot(c, dense)
        self.compressed_sq = self.compressed_sq + torch.dot(c, c)
        self.dense_sq = self.dense_sq + torch.dot(dense, dense)
        spent = time.perf_counter() - began
        self.reference_s += spent
        self.spent_s += spent


@dataclass(frozen=True, slots=True, kw_only=True)
class Quality:
    """The job's figures of one step, the same on every rank (``agree``); norms of the
    unscaled gradients."""

    replica_sq: float
    """Mean over the data-parallel replicas of |g_i|^2, their own gradients."""
    update_sq: float
    """|u|^2 of the gradient the optimizer applied (the reduced one)."""
    class_norms: dict[str, float]
    """|u| of each module class's parameters (``other``: parameters outside every class)."""
    dense_sq: float | None
    """|d|^2 of the dense average: exact where the reduction is dense, on a compressed
    job's reference steps ``replica_sq`` less the replicas' sketched spread around it,
    ``None`` otherwise."""
    cosine: float | None = None
    """cos(c, d) of the compressed and the dense average (reference steps)."""
    relative_error: float | None = None
    """|c - d| / |d| (reference steps)."""
    residual_norm: float | None = None
    """RMS over the replicas of the error-feedback residual's norm (top-k, PowerSGD)."""
    reference_s: float | None = None
    """Mean seconds of the reference's dense all-reduce (reference steps)."""
    step_s: float = 0.0
    """Mean seconds of the step so far over the ranks (for the reference schedule)."""
    sync_s: float = 0.0
    """Mean seconds over the ranks of the step's gradient reduction (waiting for the
    slower ranks included; 0 where it is not timed apart), for ``AdaptiveTopk``."""
    measure_s: float = 0.0
    """Seconds the reporting rank spent measuring in the step: the probe's and the
    figures' all-reduce (the overhead of measuring, as its share of the step)."""


def agree(
    probe: Probe,
    class_sq: Tensor,
    classes: Sequence[str],
    *,
    replicas: int,
    world: int,
    scale: float,
    dense_reduction: bool,
    step_s: float,
    sync_s: float = 0.0,
) -> Quality:
    """Sum ``probe`` and the per-class squared norms ``class_sq`` (of the unscaled update,
    this rank's parts) over all ``world`` ranks in one all-reduce (none on one rank) and
    make the job's figures: every replica holds a copy of the update, so sums over the
    world are ``replicas`` times the job's. ``dense_reduction``: the update is the dense
    average (no compression), so |d|^2 = |u|^2 on every step."""
    began = time.perf_counter()
    s2 = scale * scale

    def f(x: Tensor | float) -> Tensor:
        return x.detach().float().reshape(1) if isinstance(x, Tensor) else torch.tensor([x])

    head = torch.cat(
        [
            f(probe.local_sq) / s2,
            f(probe.dot) / s2,
            f(probe.compressed_sq) / s2,
            f(probe.dense_sq) / s2,
            f(probe.residual_sq) / s2,
            f(probe.spread_sq) / s2,
            torch.tensor([probe.reference_s, step_s, sync_s]),
        ]
    ).to(class_sq.device)
    vector = torch.cat([head, class_sq.float()])
    if world > 1:
        dist.all_reduce(vector)
    values = vector.cpu().tolist()
    local, dot, c_sq, d_sq, r_sq, spread, ref_s, mean_step, mean_sync = values[:9]
    per_class = values[9:]
    n = replicas
    update = sum(per_class) / n
    out: dict[str, Any] = {}
    dense: float | None = update if dense_reduction else None
    if probe.reference and not dense_reduction:
        # |d|^2 = mean |g_i|^2 - mean |g_i - d|^2 (exact identity; the second sketched).
        dense = max(0.0, (local - spread) / n)
        d_sq, dot, c_sq = d_sq / n, dot / n, c_sq / n
        if d_sq > 0 and c_sq > 0:
            out["cosine"] = dot / math.sqrt(d_sq * c_sq)
            out["relative_error"] = math.sqrt(max(0.0, c_sq - 2 * dot + d_sq) / d_sq)
        out["reference_s"] = ref_s / world
    return Quality(
        replica_sq=local / n,
        update_sq=update,
        class_norms={
            c: math.sqrt(max(0.0, v / n)) for c, v in zip(classes, per_class, strict=True)
        },
        dense_sq=dense,
        residual_norm=math.sqrt(r_sq / n) if r_sq > 0 else None,
        step_s=mean_step / world,
        sync_s=mean_sync / world,
        measure_s=probe.spent_s + time.perf_counter() - began,
        **out,
    )


@dataclass
class ReferenceSchedule:
    """Which steps are reference steps: the first one measured, then as often as
    ``budget`` of the step time allows."""

    budget: float = REFERENCE_BUDGET
    next_step: int = 0

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def done(self, step: int, quality: Quality) -> None:
        """After reference step ``step``: schedule the next from its agreed cost."""
        cost = quality.reference_s or 0.0
        base = max(quality.step_s - cost, 1e-9)
        self.next_step = step + max(1, math.ceil(cost / (self.budget * base)))


@dataclass
class NormGuard:
    """Counts, per module class, the steps in a row whose gradient norm grew by more than
    ``growth``; ``observe`` names the classes that reached ``steps`` in a row (and starts
    their count again)."""

    growth: float = GROWTH
    steps: int = GROWTH_STEPS
    last: dict[str, float] = field(default_factory=dict)
    streak: dict[str, int] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    """Each class's norm before its current streak."""

    def observe(self, norms: dict[str, float]) -> dict[str, float]:
        """Feed one step's class norms; returns ``{class: growth over the streak}`` of
        the classes that grew too fast ``steps`` times in a row."""
        fired: dict[str, float] = {}
        for cls, norm in norms.items():
            previous = self.last.get(cls)
            grew = (
                previous is not None
                and previous > 0
                and math.isfinite(norm)
                and norm > self.growth * previous
            )
            self.streak[cls] = self.streak.get(cls, 0) + 1 if grew else 0
            if self.streak[cls] >= self.steps:
                fired[cls] = norm / self.first[cls] if self.first.get(cls) else math.inf
                self.streak[cls] = 0
            if self.streak[cls] == 1:
                self.first[cls] = previous or 0.0
            self.last[cls] = norm
        return fired


@dataclass
class NoiseScale:
    """Pollux's online estimate of the gradient noise scale from the replicas' and the
    averaged gradients' squared norms (module docstring), in samples."""

    smoothing: float = NOISE_SMOOTHING
    sqr: float = 0.0
    var: float = 0.0
    weight: float = 0.0
    """Sum of the averages' weights (bias correction)."""
    measurements: int = 0
    last_step: int | None = None

    def update(
        self,
        replica_sq: float,
        dense_sq: float,
        replica_batch: float,
        batch: float,
        step: int | None = None,
    ) -> None:
        """Step ``step``'s figures: mean |g_i|^2 over replicas of ``replica_batch``
        samples and |g|^2 of their average over ``batch`` samples (> ``replica_batch``).
        The past decays by ``smoothing`` per step since the last measurement (a
        compressed job measures on reference steps only), or per measurement where
        ``step`` is not given."""
        if batch <= replica_batch or not (math.isfinite(replica_sq) and math.isfinite(dense_sq)):
            return
        gap = 1 if step is None or self.last_step is None else max(1, step - self.last_step)
        self.last_step = step
        b, big = replica_batch, batch
        sqr = (big * dense_sq - b * replica_sq) / (big - b)
        var = (replica_sq - dense_sq) / (1 / b - 1 / big)
        a = self.smoothing**gap
        self.sqr = a * self.sqr + (1 - a) * sqr
        self.var = a * self.var + (1 - a) * var
        self.weight = a * self.weight + (1 - a)
        self.measurements += 1

    def record(self, quality: Quality, samples: float, replicas: int, step: int) -> None:
        """A step's ``quality`` figures, of ``samples`` over ``replicas`` even replicas;
        nothing where the step measured no dense average or had one replica."""
        if quality.dense_sq is None or replicas < 2:
            return
        self.update(quality.replica_sq, quality.dense_sq, samples / replicas, samples, step)

    @property
    def reported(self) -> float | None:
        """``value`` once there are ``NOISE_MIN_MEASUREMENTS`` measurements: what a job
        reports (``JobMetrics.noise_scale``)."""
        return self.value if self.measurements >= NOISE_MIN_MEASUREMENTS else None

    @property
    def gradient_sq(self) -> float | None:
        """|G|^2, the true gradient's squared norm (bias-corrected average)."""
        return self.sqr / self.weight if self.weight > 0 else None

    @property
    def variance(self) -> float | None:
        """tr(S), the per-sample gradient variance (bias-corrected average)."""
        return self.var / self.weight if self.weight > 0 else None

    @property
    def value(self) -> float | None:
        """B_noise = tr(S) / |G|^2 in samples; ``None`` before a measurement or while the
        averaged |G|^2 is not positive (noise swamps the signal: no batch size is too
        large for it yet)."""
        if self.weight <= 0 or self.sqr <= 0:
            return None
        return max(0.0, self.var / self.sqr)


@dataclass
class BatchScaling:
    """AdaScale's learning rate for a job trained at ``batch`` samples a step when its
    learning rate was tuned for ``reference_batch`` (< ``batch``): the rate times the
    gain r = (M / M0) (phi + M0) / (phi + M) (``autotune.perf.model.batch_gain``), phi
    the noise scale the ranks measure (``NoiseScale``, from every rank's identical
    ``Quality``, so every rank steps alike), ``prior`` until it is reported, 1 without
    either. At r the step makes r reference steps' progress, which is what the
    performance model credits a larger batch with; at the tuned rate a 4x batch made
    1.7x (resnet-mini, dp=2: 90-91 steps to plain DDP's loss at step 150, against 50-53
    at r's rate and the model's 53; ``bench/batch_learning_rate.py``)."""

    reference_batch: int
    batch: int
    prior: float | None = None
    noise: NoiseScale = field(default_factory=NoiseScale)

    def __post_init__(self) -> None:
        if not 0 < self.reference_batch < self.batch:
            raise ValueError(
                f"BatchScaling: batch {self.batch} must exceed the reference batch "
                f"{self.reference_batch} (> 0)"
            )

    def record(self, quality: Quality, replicas: int, step: int) -> None:
        """A step's agreed figures, of ``batch`` samples over ``replicas``."""
        self.noise.record(quality, self.batch, replicas, step)

    @property
    def noise_scale(self) -> float | None:
        """The noise scale the gain rests on: measured, else the prior."""
        measured = self.noise.reported
        return measured if measured is not None else self.prior

    @property
    def gain(self) -> float:
        phi = self.noise_scale
        if phi is None or phi <= 0:
            return 1.0
        return batch_gain(phi, self.reference_batch, self.batch)
