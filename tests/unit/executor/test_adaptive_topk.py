"""Adaptive top-k (``autotune.executor.compression.AdaptiveTopk``): the kept share moves
to the fastest step whose compressed average stays faithful, from the figures the ranks
agreed; in a real data-parallel job every rank moves alike, the bytes sent follow the
share, and a checkpoint resumes at the share reached."""

from __future__ import annotations

import random

import pytest

from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.executor.compression import TOPK_LADDER, AdaptiveTopk
from autotune.executor.local import run_local
from autotune.executor.quality import Quality
from autotune.executor.worker import WorkerSpec
from autotune.kernels import topk_count


def figures(step_s: float, cosine: float | None, sync_s: float | None = None) -> Quality:
    """A step's agreed figures; the reduction takes half the step unless told."""
    return Quality(
        replica_sq=1.0,
        update_sq=1.0,
        class_norms={},
        dense_sq=None,
        cosine=cosine,
        step_s=step_s,
        sync_s=step_s / 2 if sync_s is None else sync_s,
    )


def settle(
    rule: AdaptiveTopk,
    step_s: dict[float, float],
    cosine: dict[float, float],
    steps: int = 400,
    sync_s: dict[float, float] | None = None,
) -> list[float]:
    """Feed ``rule`` every step the figures of its current share (a reference step every
    other step); the shares it went through."""
    path = [rule.ratio]
    for i in range(steps):
        r = rule.ratio
        sync = None if sync_s is None else sync_s[r]
        move = rule.observe(figures(step_s[r], cosine[r] if i % 2 else None, sync))
        if move is not None:
            assert move[0] == rule.ratio
            path.append(move[0])
    return path


# Fidelity that falls as less is kept: below the floor (0.6) under 0.5%.
COSINE = {r: 0.4 if r < 0.005 else 0.9 for r in TOPK_LADDER}


def test_a_communication_bound_job_keeps_the_least_that_stays_faithful() -> None:
    """Step time proportional to the share (a slow link): from 1% it tries 0.5% (faster,
    faithful), then 0.2% (cosine under the floor: back up), and stays at 0.5%, never
    trying 0.2% again."""
    step_s = {r: 0.05 + 10 * r for r in TOPK_LADDER}
    rule = AdaptiveTopk(ratio=0.01)
    path = settle(rule, step_s, COSINE, sync_s={r: 10 * r for r in TOPK_LADDER})
    assert path[:4] == [0.01, 0.005, 0.002, 0.005]
    assert rule.ratio == 0.005
    assert path.count(0.002) == 1
    assert rule.unfaithful == 0.002


def test_it_stops_keeping_less_once_keeping_less_stops_paying() -> None:
    """gpt-char's steps over four 100 Mbit/s machines (measured): 1% to 0.5% saves 12%
    of the step, 0.5% to 0.2% 1.5%. Every share faithful: it never tries 0.1%, and keeps
    0.5%, the largest share within 5% of the fastest step."""
    step_s = {0.001: 0.129, 0.002: 0.133, 0.005: 0.135, 0.01: 0.153, 0.02: 0.2}
    step_s |= {r: 0.3 for r in TOPK_LADDER if r > 0.02}
    rule = AdaptiveTopk(ratio=0.01)
    path = settle(rule, step_s, dict.fromkeys(TOPK_LADDER, 0.8))
    assert 0.001 not in path
    assert path[:4] == [0.01, 0.005, 0.002, 0.005]
    assert rule.ratio == 0.005


def test_a_job_bound_by_latency_keeps_more_where_it_costs_no_time() -> None:
    """The same step time at every share (a fast link, or latency): after finding the
    shares below no faster it climbs to the most faithful one, the ladder's top."""
    step_s = dict.fromkeys(TOPK_LADDER, 0.05)
    rule = AdaptiveTopk(ratio=0.01)
    settle(rule, step_s, COSINE)
    assert rule.ratio == TOPK_LADDER[-1]


def test_a_job_bound_by_computation_never_tries_keeping_less() -> None:
    """The reduction takes 1% of the step, less than the 5% a faster step must gain:
    keeping less cannot pay, so it only tries keeping more."""
    step_s = dict.fromkeys(TOPK_LADDER, 0.05)
    rule = AdaptiveTopk(ratio=0.01)
    path = settle(rule, step_s, COSINE, sync_s=dict.fromkeys(TOPK_LADDER, 0.0005))
    assert path == sorted(path)
    assert rule.ratio == TOPK_LADDER[-1]


def test_between_the_two_it_stops_where_keeping_more_starts_to_cost() -> None:
    """Flat up to 5%, then each rung dearer by 20%: it keeps 5%, the largest share within
    5% of the fastest step."""
    step_s = {r: 0.05 * (1.2 ** max(0, TOPK_LADDER.index(r) - 5)) for r in TOPK_LADDER}
    rule = AdaptiveTopk(ratio=0.01)
    settle(rule, step_s, COSINE)
    assert rule.ratio == 0.05


def test_step_times_within_the_noise_do_not_send_it_back_and_forth() -> None:
    """Every share's step as fast as the others' but for 8% of noise each step (a shared
    host): it settles after a handful of moves instead of moving all run long."""
    rng = random.Random(0)
    rule = AdaptiveTopk(ratio=0.01)
    moves = 0
    for i in range(2000):
        step = 0.1 * (1 + rng.uniform(-0.08, 0.08))
        moves += rule.observe(figures(step, COSINE[rule.ratio] if i % 2 else None)) is not None
    assert moves <= 10
    assert rule.settled


def test_it_waits_for_enough_steps_and_references_and_stays_within_its_limits() -> None:
    rule = AdaptiveTopk(ratio=0.01, low=0.01, high=0.05)
    for _ in range(20):  # steps, but no reference step: no cosine to judge by
        assert rule.observe(figures(0.1, None)) is None
    assert rule.observe(figures(0.1, 0.9)) is None  # one reference, two needed
    move = rule.observe(figures(0.1, 0.9))
    assert move is not None  # at the lower limit, as fast as any: try keeping more
    assert move[0] == 0.02
    assert "try keeping more" in move[1]
    settle(rule, dict.fromkeys(TOPK_LADDER, 0.05), COSINE)
    assert rule.ratio == 0.05  # the upper limit
    with pytest.raises(ValueError, match="limits"):
        AdaptiveTopk(ratio=0.01, low=0.1, high=0.01)
    with pytest.raises(ValueError, match="measure_quality"):
        WorkerSpec(
            task="mlp-synthetic",
            config=JobConfig(layout=Layout(world_size=2, dp=2)),
            adaptive_topk=True,
            measure_quality=False,
        )


@pytest.mark.slow
def test_every_rank_moves_alike_and_a_checkpoint_resumes_at_the_share_reached() -> None:
    """mlp-synthetic at dp=2 from top-k 1%: the share moves (the events are the same on
    both ranks), each step sends the values and int64 indices of the share it had, and a
    job restarted from its checkpoint goes on at the share reached, saying so."""
    spec = WorkerSpec(
        task="mlp-synthetic",
        config=JobConfig(
            layout=Layout(world_size=2, dp=2),
            compression=CompressionSpec(kind="topk", ratio=0.01),
        ),
        seed=1,
        adaptive_topk=True,
    )
    run = run_local(spec, 80)
    moves = [[e for r in rank for e in r.events] for rank in run.reports]
    assert moves[0] == moves[1]
    assert moves[0], "the share never moved in 80 steps"
    numel = sum(t.numel() for t in run.state["model"].values())
    ratio = 0.01
    changes = {e["step"]: e["to"] for e in moves[0]}
    for report in run.reports[0]:
        assert report.bytes_sent == topk_count(numel, ratio) * 12, report.step
        ratio = changes.get(report.step - 1, ratio)  # applies from the next step
    assert run.state["compression"]["ratio"] == ratio
    resumed = run_local(spec, 1, state=run.state, save=False)
    note = [e for e in resumed.events() if e["kind"] == "compression_ratio"]
    if ratio != 0.01:
        assert note, "resuming at another share than the config's says so"
    first = resumed.reports[0][0]
    assert first.bytes_sent == topk_count(numel, ratio) * 12
