"""Samples per step come from the task's batches (or its declared batch size), and a task
whose samples cannot be counted is refused before it starts; Ray nodes get readable
names."""

from __future__ import annotations

import pytest
import torch
from helpers import REPO

from autotune.core import JobConfig
from autotune.executor.cluster import node_names
from autotune.executor.runner import JobRunner, RunnerConfig
from autotune.executor.tasks import MLPSynthetic, TaskError, count_samples, declared_samples

USER_TASK = REPO / "tests" / "data" / "user_task.py"


@pytest.mark.parametrize(
    ("batch", "samples"),
    [
        (torch.zeros(16, 3), 16),
        ((torch.zeros(8, 32), torch.zeros(8, 32)), 8),
        ([torch.zeros(4)], 4),
        ({"tokens": torch.zeros(5, 2), "mask": torch.zeros(9)}, 5),
        (("a caption", {"image": torch.zeros(3, 3, 8, 8)}), 3),  # the first tensor, depth first
        ((torch.tensor(1.0), torch.zeros(6)), 6),  # a scalar has no batch dimension
        (["no tensor"], None),
        ({}, None),
    ],
)
def test_samples_are_the_leading_dimension_of_the_first_tensor(
    batch: object, samples: int | None
) -> None:
    assert count_samples(batch) == samples


def test_a_declared_batch_size_is_the_samples_per_step() -> None:
    assert declared_samples(MLPSynthetic(batch_size=10)) == 10
    assert declared_samples(object()) is None

    class Bad:
        batch_size = 0

    assert declared_samples(Bad()) is None


def test_a_task_without_countable_batches_is_refused_before_it_starts() -> None:
    run = RunnerConfig(task=f"{USER_TASK}:Opaque", steps=1)
    with pytest.raises(TaskError, match=r"cannot count the samples a step trains.*batch_size"):
        JobRunner(run, JobConfig.data_parallel(1))


@pytest.mark.parametrize("name", ["TinyLM", "DictTask"])
def test_a_user_task_without_batch_size_is_counted_not_zero(name: str) -> None:
    runner = JobRunner(
        RunnerConfig(task=f"{USER_TASK}:{name}", steps=1), JobConfig.data_parallel(1)
    )
    assert runner.samples_per_step is None  # counted from each step's batches
    assert runner.tokens_per_sample == 32


def test_ray_nodes_are_named_by_host_with_a_suffix_only_when_a_host_has_several() -> None:
    entries = [
        {"NodeID": "aa" * 28, "NodeManagerHostname": "gpu-box-1", "NodeManagerAddress": "10.0.0.1"},
        {"NodeID": "bb" * 28, "NodeManagerHostname": "gpu-box-2", "NodeManagerAddress": "10.0.0.2"},
        {"NodeID": "cc" * 28, "NodeManagerHostname": "gpu-box-2", "NodeManagerAddress": "10.0.0.2"},
        {"NodeID": "dd" * 28, "NodeManagerAddress": "10.0.0.4"},
        {"NodeID": "ee" * 28, "NodeManagerHostname": "weird host/name"},
    ]
    assert node_names(entries) == {
        "aa" * 28: "gpu-box-1",
        "bb" * 28: "gpu-box-2-bbbbbb",
        "cc" * 28: "gpu-box-2-cccccc",
        "dd" * 28: "10.0.0.4",
        "ee" * 28: "weird-host-name",
    }


def test_a_name_once_given_stays_with_its_node() -> None:
    first = [{"NodeID": "aa" * 28, "NodeManagerHostname": "box"}]
    given = node_names(first)
    assert given == {"aa" * 28: "box"}
    # A second Ray node joins on the same host: the first keeps its name.
    both = [*first, {"NodeID": "bb" * 28, "NodeManagerHostname": "box"}]
    assert node_names(both, given) == {"aa" * 28: "box", "bb" * 28: "box-bbbbbb"}


def test_a_dead_node_is_lost_and_its_name_goes_to_the_node_that_takes_its_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from autotune.executor import cluster

    monkeypatch.setattr(cluster, "_named", {})
    monkeypatch.setattr(cluster, "_seen", {})

    def entry(node_id: str, host: str, alive: bool = True) -> dict[str, object]:
        return {
            "NodeID": node_id,
            "NodeManagerHostname": host,
            "Alive": alive,
            "Resources": {"CPU": 2.0, "memory": 2.0 * 2**30},
        }

    entries = [entry("aa" * 28, "box-1"), entry("bb" * 28, "box-2")]
    monkeypatch.setattr(ray, "nodes", lambda: entries)
    first = cluster.ray_cluster()
    assert [n.node_id for n in first.alive] == ["box-1", "box-2"]
    assert first.lost == []
    entries[1] = entry("bb" * 28, "box-2", alive=False)  # its raylet died
    gone = cluster.ray_cluster()
    assert [n.node_id for n in gone.alive] == ["box-1"]
    assert [n.node_id for n in gone.lost] == ["box-2"]
    assert cluster.ray_node_id("box-2") == "bb" * 28  # still known, for the lost placement
    entries.append(entry("cc" * 28, "box-2"))  # a raylet starts again on that host
    back = cluster.ray_cluster()
    assert [n.node_id for n in back.alive] == ["box-1", "box-2"]
    assert back.lost == []
    assert cluster.ray_node_id("box-2") == "cc" * 28
