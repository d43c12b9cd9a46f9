"""Compression state in checkpoints, with the ranks in local processes over gloo (no
Ray): top-k's error-feedback residuals and PowerSGD's memories are saved from every
data-parallel rank and restored, so a restarted job trains on bit for bit as the
uninterrupted one; a change of the data-parallel degree re-shards them (the mean
residual to every rank), a change of compression or to one rank drops them, saying so."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.executor.local import run_local
from autotune.executor.worker import WorkerSpec

# Every test starts process groups of 2-4 ranks (seconds each): behind -m slow.
pytestmark = pytest.mark.slow

TOPK = CompressionSpec(kind="topk", ratio=0.05)
POWERSGD = CompressionSpec(kind="powersgd", rank=2)


def spec(compression: CompressionSpec, dp: int = 2, pp: int = 1) -> WorkerSpec:
    return WorkerSpec(
        task="mlp-synthetic",
        config=JobConfig(
            layout=Layout(world_size=dp * pp, dp=dp, pp=pp, micro_batches=2 if pp > 1 else 1),
            compression=compression,
        ),
        seed=1,
    )


def without_compression_state(state: dict[str, Any]) -> dict[str, Any]:
    stripped = copy.copy(state)
    stripped.pop("compression")
    return stripped


@pytest.fixture(scope="module")
def topk_checkpoint() -> dict[str, Any]:
    run = run_local(spec(TOPK), 3)
    assert run.state is not None
    return run.state


@pytest.fixture(scope="module")
def powersgd_checkpoint() -> dict[str, Any]:
    """After 4 steps: 2 of warm-up (plain all-reduce), 2 compressed."""
    run = run_local(spec(POWERSGD), 4)
    assert run.state is not None
    return run.state


@pytest.mark.parametrize(
    ("compression", "before"), [(TOPK, 3), (POWERSGD, 4)], ids=["topk", "powersgd"]
)
def test_a_restarted_job_trains_on_bit_for_bit(
    compression: CompressionSpec,
    before: int,
    topk_checkpoint: dict[str, Any],
    powersgd_checkpoint: dict[str, Any],
) -> None:
    """dp=2: ``before`` steps, checkpoint, new processes, 3 more steps: the same losses
    as 3 + ``before`` steps uninterrupted, exactly. Without the compression state the
    resumed run differs (the state is what makes it exact)."""
    uninterrupted = run_local(spec(compression), before + 3, save=False).losses()
    state = topk_checkpoint if compression.kind == "topk" else powersgd_checkpoint
    saved = state["compression"]
    assert saved["kind"] == compression.kind
    assert saved["dp"] == 2
    names = set(state["model"])
    assert set(saved["residuals"]) == names  # every parameter, by its name
    for name, per_rank in saved["residuals"].items():
        assert len(per_rank) == 2
        assert per_rank[0].shape == state["model"][name].shape
    assert any(not torch.equal(a, b) for a, b in saved["residuals"].values())  # per rank
    if compression.kind == "powersgd":
        assert saved["powersgd"]["iter"] == before
        assert saved["powersgd"]["q"]  # warm-start factors, by parameter name
        assert set(saved["powersgd"]["q"]) <= names
    resumed = run_local(spec(compression), 3, state=state, save=False)
    assert resumed.losses() == uninterrupted[before:]
    assert not resumed.events()
    cold = run_local(spec(compression), 3, state=without_compression_state(state), save=False)
    assert cold.losses() != uninterrupted[before:]


@pytest.mark.parametrize("kind", ["topk", "powersgd"])
def test_a_new_data_parallel_degree_starts_every_rank_from_the_mean_residual(
    kind: str, topk_checkpoint: dict[str, Any], powersgd_checkpoint: dict[str, Any]
) -> None:
    """dp 2 -> 4: each of the 4 ranks holds the mean of the 2 saved residuals (error
    feedback owes the update their mean; 4 ranks holding it owe it still). PowerSGD's
    factors, the same on every rank, and its step counter carry over as they are."""
    checkpoint = topk_checkpoint if kind == "topk" else powersgd_checkpoint
    four = run_local(spec(TOPK if kind == "topk" else POWERSGD, dp=4), 0, state=checkpoint)
    events = {e["kind"] for s in four.setup for e in s["restore_events"]}
    assert events == {"compression_state_resharded"}
    assert four.state is not None
    saved, now = checkpoint["compression"], four.state["compression"]
    assert now["dp"] == 4
    for name, (a, b) in saved["residuals"].items():
        assert len(now["residuals"][name]) == 4
        for residual in now["residuals"][name]:
            torch.testing.assert_close(residual, (a + b) / 2, rtol=0, atol=1e-7)
    if kind == "powersgd":
        assert now["powersgd"]["iter"] == saved["powersgd"]["iter"] == 4
        for key in ("p", "q"):
            assert now["powersgd"][key].keys() == saved["powersgd"][key].keys()
            for name, value in saved["powersgd"][key].items():
                assert torch.equal(now["powersgd"][key][name], value), name


def test_a_layout_change_keeps_residuals_by_parameter_name(
    topk_checkpoint: dict[str, Any],
) -> None:
    """dp=2 -> dp=2 x pp=2: each stage takes its own parameters' residuals."""
    staged = run_local(spec(TOPK, pp=2), 0, state=topk_checkpoint)
    assert not [e for s in staged.setup for e in s["restore_events"]]
    assert staged.state is not None
    saved, now = topk_checkpoint["compression"]["residuals"], staged.state["compression"]
    assert now["residuals"].keys() == saved.keys()
    for name, per_rank in saved.items():
        for old, new in zip(per_rank, now["residuals"][name], strict=True):
            assert torch.equal(old, new), name


def test_compression_state_that_cannot_carry_over_is_dropped_with_an_event(
    topk_checkpoint: dict[str, Any],
) -> None:
    one = run_local(spec(TOPK, dp=1), 1, state=topk_checkpoint, save=False)
    [reset] = [e for e in one.events() if e["kind"] == "compression_state_reset"]
    assert reset["step"] == 3
    assert "data-parallel degree 2 -> 1" in reset["detail"]
    switched = run_local(spec(CompressionSpec(kind="int8")), 0, state=topk_checkpoint)
    details = {e["detail"] for s in switched.setup for e in s["restore_events"]}
    assert details == {
        "compression changed from topk to int8: the topk error-feedback residuals are dropped"
    }


def test_residuals_are_saved_unsharded_and_restore_into_another_tp_degree() -> None:
    """dp=2 x tp=2 (gpt-char's attention and MLP sharded): the residuals are saved as
    full tensors under the whole model's names; dp=2 x tp=1 takes them as they are, and
    gives them back to tp=2."""
    gpt = WorkerSpec(
        task="gpt-char",
        config=JobConfig(layout=Layout(world_size=4, dp=2, tp=2), compression=TOPK),
        seed=1,
    )
    sharded = run_local(gpt, 2)
    assert sharded.state is not None
    saved = sharded.state["compression"]["residuals"]
    assert set(saved) == set(sharded.state["model"])
    for name, per_rank in saved.items():
        assert [t.shape for t in per_rank] == [sharded.state["model"][name].shape] * 2
    plain = WorkerSpec(
        task="gpt-char",
        config=JobConfig(layout=Layout(world_size=2, dp=2), compression=TOPK),
        seed=1,
    )
    restored = run_local(plain, 0, state=sharded.state)
    assert restored.state is not None
    for name, per_rank in saved.items():
        for old, new in zip(
            per_rank, restored.state["compression"]["residuals"][name], strict=True
        ):
            assert torch.equal(old, new), name
    # and back: tp=1's full residuals sharded again over tp=2, then gathered unchanged
    again = run_local(gpt, 0, state=restored.state)
    assert again.state is not None
    for name, per_rank in saved.items():
        for old, new in zip(per_rank, again.state["compression"]["residuals"][name], strict=True):
            assert torch.equal(old, new), name
