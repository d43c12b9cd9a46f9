"""A rank's step report is a typed, immutable record that survives the trip from a Ray
actor or a spawned process (pickling), and the events many ranks report are kept once."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from autotune.executor.reports import RankStep, distinct_events


def report(rank: int, *events: dict[str, object], loss: float | None = None) -> RankStep:
    return RankStep(
        rank=rank,
        step=3,
        loss=loss,
        samples=8 if rank == 0 else None,
        step_time_s=0.25,
        sync_time_s=0.05,
        bytes_sent=1024,
        bytes_dense=4096,
        events=tuple(events),
        peak_memory_bytes=2**20,
        power_watts=None,
        fp8_mode=None,
    )


def test_a_step_report_is_frozen_and_pickles() -> None:
    step = report(0, {"step": 2, "kind": "grad_overflow", "loss_scale": 1024.0}, loss=2.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.loss = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(step)) == step


def test_events_every_rank_reports_are_kept_once_in_order() -> None:
    fell_back = {"step": 2, "kind": "nonfinite", "module_class": "attention"}
    also = {"step": 2, "kind": "nonfinite", "module_class": "mlp"}
    reports = [report(0, fell_back, also), report(1, dict(fell_back)), report(2)]
    assert distinct_events(reports) == [fell_back, also]
    assert distinct_events([]) == []
