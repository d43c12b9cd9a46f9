"""Training quality measured while a job trains (``autotune.executor.quality``): the
sketch the fidelity and the noise scale rest on, the noise-scale estimator against a
known noise scale, the reference schedule, the gradient-norm guard, and the figures the
ranks of a real data-parallel job agree on."""

from __future__ import annotations

import math

import pytest
import torch

from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.executor.local import LocalRun, run_local
from autotune.executor.quality import (
    NOISE_MIN_MEASUREMENTS,
    SKETCH_SIZE,
    BatchScaling,
    NoiseScale,
    NormGuard,
    Probe,
    Quality,
    ReferenceSchedule,
    agree,
    count_sketch,
)
from autotune.executor.worker import QUALITY_CLASSES, WorkerSpec
from autotune.perf.model import batch_gain


def heavy_tailed(n: int, seed: int) -> torch.Tensor:
    """Mostly tiny coordinates and a few huge ones (an embedding's gradient): uniform
    sampling of coordinates misses what matters, a sketch does not."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 1e-3
    x[torch.randint(n, (20,), generator=g)] += torch.randn(20, generator=g) * 10
    return x


def test_the_sketch_is_linear_seeded_and_exact_when_small() -> None:
    x, y = heavy_tailed(100_000, 0), heavy_tailed(100_000, 1)
    assert torch.allclose(
        count_sketch(x + y, 7), count_sketch(x, 7) + count_sketch(y, 7), atol=1e-4
    )
    assert torch.equal(count_sketch(x, 7), count_sketch(x, 7))
    assert not torch.equal(count_sketch(x, 7), count_sketch(x, 8))
    small = torch.randn(SKETCH_SIZE)
    assert torch.equal(count_sketch(small, 3), small)


def test_sketched_norms_and_inner_products_are_close_on_heavy_tails() -> None:
    """Over 20 keys: each estimate within 10%, their mean within 3% (the bound says
    about sqrt(2/4096) = 2% each)."""
    x = heavy_tailed(300_000, 0)
    y = x + heavy_tailed(300_000, 1) * 0.3
    true_sq, true_dot = float(x @ x), float(x @ y)
    sq, dots = [], []
    for key in range(20):
        sx, sy = count_sketch(x, key), count_sketch(y, key)
        sq.append(float(sx @ sx))
        dots.append(float(sx @ sy))
    assert all(abs(v / true_sq - 1) < 0.1 for v in sq)
    assert abs(sum(sq) / len(sq) / true_sq - 1) < 0.03
    assert abs(sum(dots) / len(dots) / true_dot - 1) < 0.03


def test_the_noise_scale_estimate_finds_a_known_noise_scale() -> None:
    """Replicas of b samples whose gradients are G plus per-sample noise of trace
    tr(S): the estimate converges on tr(S) / |G|^2."""
    g = torch.Generator().manual_seed(0)
    n, replicas, b = 2_000, 4, 16
    true = torch.randn(n, generator=g)
    per_sample_std = 0.5
    trace = per_sample_std**2 * n
    expected = trace / float(true @ true)
    noise = NoiseScale(smoothing=0.99)
    for step in range(600):
        grads = [
            true + torch.randn(n, generator=g) * per_sample_std / math.sqrt(b)
            for _ in range(replicas)
        ]
        mean = torch.stack(grads).mean(0)
        replica_sq = sum(float(x @ x) for x in grads) / replicas
        noise.update(replica_sq, float(mean @ mean), b, b * replicas, step=step)
    assert noise.value is not None
    assert abs(noise.value / expected - 1) < 0.1, (noise.value, expected)
    assert noise.variance is not None
    assert abs(noise.variance / trace - 1) < 0.1


def test_sparse_measurements_decay_the_past_by_the_steps_between_them() -> None:
    every, sparse = NoiseScale(), NoiseScale()
    for step in range(30):
        value = 1.0 if step < 20 else 3.0
        every.update(2 * value, value, 1, 2, step=step)
        if step % 10 == 0 or step == 29:
            sparse.update(2 * value, value, 1, 2, step=step)
    assert every.gradient_sq is not None
    assert sparse.gradient_sq is not None
    assert sparse.gradient_sq == pytest.approx(every.gradient_sq, rel=0.15)


def test_reference_steps_come_as_often_as_the_budget_allows() -> None:
    schedule = ReferenceSchedule(budget=0.01)
    assert schedule.due(0)
    figures = Quality(
        replica_sq=1, update_sq=1, class_norms={}, dense_sq=1, reference_s=0.02, step_s=1.02
    )
    schedule.done(0, figures)
    assert schedule.next_step == 2  # 0.02 s against 1% of a 1 s step
    schedule.done(
        2,
        Quality(replica_sq=1, update_sq=1, class_norms={}, dense_sq=1, reference_s=0.0, step_s=1.0),
    )
    assert schedule.next_step == 3


def test_the_guard_fires_on_three_growing_steps_in_a_row_only() -> None:
    guard = NormGuard()
    assert guard.observe({"ffn": 1.0, "head": 1.0}) == {}
    assert guard.observe({"ffn": 1.3, "head": 1.3}) == {}
    assert guard.observe({"ffn": 1.7, "head": 1.4}) == {}  # head grew 8%: its count restarts
    fired = guard.observe({"ffn": 2.2, "head": 1.8})
    assert set(fired) == {"ffn"}
    assert fired["ffn"] == pytest.approx(2.2)
    assert guard.observe({"ffn": 2.9, "head": 2.3}) == {}  # ffn counts again from zero


def test_one_rank_agrees_with_itself() -> None:
    probe = Probe()
    probe.add_local(torch.tensor([3.0, 4.0]))
    class_sq = torch.zeros(len(QUALITY_CLASSES))
    class_sq[QUALITY_CLASSES.index("ffn")] = 16.0
    q = agree(
        probe,
        class_sq,
        QUALITY_CLASSES,
        replicas=1,
        world=1,
        scale=2.0,
        dense_reduction=True,
        step_s=0.5,
        sync_s=0.2,
    )
    assert q.replica_sq == pytest.approx(25 / 4)  # loss scale 2 taken out
    assert (q.step_s, q.sync_s) == pytest.approx((0.5, 0.2))
    assert q.class_norms["ffn"] == pytest.approx(4.0)
    assert q.update_sq == q.dense_sq == pytest.approx(16.0)
    assert q.cosine is None


def _run(compression: str, steps: int, **kwargs: object):
    config = JobConfig(
        layout=Layout(world_size=2, dp=2), compression=CompressionSpec.parse(compression)
    )
    return run_local(
        WorkerSpec(task="gpt-char", config=config, batch_size=32, **kwargs), steps, save=False
    )


@pytest.mark.slow
def test_a_data_parallel_job_measures_its_gradients() -> None:
    """gpt-char at dp=2. Dense: every step gives the replicas' and the average's norms,
    the first larger (noise). int8 and top-k 1%: reference steps compare with the dense
    average (the first step's is the dense job's own, same seed and data: the estimate
    matches it within 1%); int8 is nearly exact, top-k 1% far less faithful and owes a
    residual. Off, no figures."""
    dense, int8, topk = _run("none", 6), _run("int8", 6), _run("topk:0.01", 6)
    first = dense.reports[0][0].quality
    assert first is not None
    assert first.dense_sq is not None
    for report in dense.reports[0]:
        q = report.quality
        assert q is not None
        assert q.dense_sq is not None
        assert q.replica_sq > q.dense_sq > 0
        assert q.cosine is None  # no reference step on a dense job

    def agreed(reports):  # type: ignore[no-untyped-def]
        return [(r.quality.replica_sq, r.quality.dense_sq, r.quality.class_norms) for r in reports]

    assert agreed(dense.reports[1]) == agreed(dense.reports[0])  # the same on every rank
    exact = int8.reports[0][0].quality
    assert exact is not None
    assert exact.dense_sq is not None
    assert exact.cosine is not None
    assert exact.dense_sq == pytest.approx(first.dense_sq, rel=0.01)
    assert exact.cosine > 0.999
    assert exact.relative_error is not None
    assert exact.relative_error < 0.05
    sparse = topk.reports[0][0].quality
    assert sparse is not None
    assert sparse.cosine is not None
    assert sparse.relative_error is not None
    assert sparse.cosine < 0.95
    assert sparse.relative_error > 0.2
    assert sparse.residual_norm is not None
    assert sparse.residual_norm > 0
    off = _run("int8", 2, measure_quality=False)
    assert all(r.quality is None for r in off.reports[0])


@pytest.mark.slow
def test_fp16_that_overflows_finishes_with_the_fall_back_and_the_guard() -> None:
    """A regression whose targets outgrow fp16 (``bench/tasks/large_targets.py``): with
    plain dynamic loss scaling the head overflows and nearly every later step is
    skipped; with the fall-back and the gradient-norm guard no step is."""
    from helpers import REPO

    from autotune.benchmarks.precision_guard import ARMS, run_arm

    task = f"{REPO / 'bench' / 'tasks' / 'large_targets.py'}:LargeTargets"
    plain = run_arm(task, ARMS["fp16 loss scaling only"], 200, 0)
    assert plain["nan_step_rate"] > 0.5
    assert plain["changes"] == []
    health = run_arm(task, ARMS["fp16 + fall-back + guard"], 200, 0)
    assert health["nan_step_rate"] == 0
    assert health["loss_last20"] < 0.01
    assert {c["kind"] for c in health["changes"]} == {"grad_norm_growth"}
    assert all(c["from"] == "fp16" and c["to"] == "bf16" for c in health["changes"])


def test_a_larger_batch_steps_at_adascales_gain_from_the_prior_then_the_measured_noise() -> None:
    scaling = BatchScaling(reference_batch=64, batch=256, prior=400.0)
    assert scaling.gain == pytest.approx(batch_gain(400.0, 64, 256))
    # Two replicas of 128 samples whose gradients' squared norms are 1.5 against 1 for
    # their average: |G|^2 = 0.5, tr(S) = 128, a noise scale of 256 samples. Once the job
    # has measured enough steps, its own noise scale replaces the prior.
    for step in range(NOISE_MIN_MEASUREMENTS):
        scaling.record(
            Quality(replica_sq=1.5, update_sq=1.0, class_norms={}, dense_sq=1.0),
            replicas=2,
            step=step,
        )
    measured = scaling.noise.reported
    assert measured == pytest.approx(256.0)
    assert scaling.noise_scale == measured
    assert scaling.gain == pytest.approx(batch_gain(measured, 64, 256))
    assert BatchScaling(reference_batch=64, batch=256).gain == 1.0  # nothing to go on
    with pytest.raises(ValueError, match="must exceed"):
        BatchScaling(reference_batch=64, batch=64)


def test_a_job_above_its_tuned_batch_trains_at_the_scaled_learning_rate() -> None:
    """mlp-synthetic at dp=2 and twice the batch its rate is tuned for: from the first
    step its rate is scaled by the prior's gain (a ``learning_rate`` event says so), and
    it trains otherwise than at the tuned rate; at or below the tuned batch nothing
    changes."""
    config = JobConfig(layout=Layout(world_size=2, dp=2))

    def run(reference: int | None) -> LocalRun:
        spec = WorkerSpec(
            task="mlp-synthetic",
            config=config,
            batch_size=128,
            lr_reference_batch=reference,
            noise_prior=100.0,
        )
        return run_local(spec, 4, save=False)

    scaled, plain, same = run(64), run(None), run(128)
    events = [e for r in scaled.reports[0] for e in r.events if e["kind"] == "learning_rate"]
    assert events[0]["step"] == 0
    assert events[0]["gain"] == pytest.approx(batch_gain(100.0, 64, 128), abs=1e-4)
    assert events[0]["measured"] is False
    assert scaled.losses()[0] == plain.losses()[0]  # the first step's loss precedes it
    assert scaled.losses()[1:] != plain.losses()[1:]
    assert same.losses() == plain.losses()
    assert not any(e["kind"] == "learning_rate" for r in same.reports[0] for e in r.events)
