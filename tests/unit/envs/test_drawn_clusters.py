"""Clusters drawn at random for training a policy that generalises: their shapes, and
the training episodes played on them."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from autotune.catalog.devices import device
from autotune.envs.presets import CLUSTER_MODELS, LINK_GBPS, drawn_cluster
from autotune.errors import InputError
from autotune.policies.ppo import DRAWN_CLUSTERS, make_train_env
from autotune.policies.ppo_settings import PPOSettings, TraceSource


def test_drawn_clusters_span_sizes_models_and_links() -> None:
    rng = np.random.default_rng(0)
    sizes, kinds, links, mixes = [], Counter[str](), set(), Counter[int]()
    for _ in range(200):
        nodes = drawn_cluster(rng)
        gpus = Counter[str]()
        for node in nodes:
            gpus[node.gpu_model] += node.gpu_count
            # Small cards four to a node, the others eight.
            small = device(node.gpu_model).memory_bytes <= 24 << 30
            assert node.gpu_count == (4 if small else 8)
        assert len({n.node_id for n in nodes}) == len(nodes)
        assert len({n.inter_node_bandwidth_gbps for n in nodes}) == 1
        sizes.append(sum(gpus.values()))
        kinds.update(gpus)
        mixes[len(gpus)] += 1
        links.add(nodes[0].inter_node_bandwidth_gbps)
    # About 16 to 512 GPUs (a node per model at least, sizes rounded to whole nodes).
    assert 4 <= min(sizes) < 32
    assert 350 < max(sizes) <= 560
    assert set(kinds) == set(CLUSTER_MODELS)
    assert set(mixes) == {1, 2, 3}
    assert links == set(LINK_GBPS)
    # Reproducible from the seed.
    again = [drawn_cluster(np.random.default_rng(5)) for _ in range(2)]
    assert again[0] == again[1]
    with pytest.raises(InputError, match="gpus"):
        drawn_cluster(rng, gpus=(0, 4))


def test_training_episodes_play_drawn_clusters() -> None:
    source = TraceSource(kind="clusters", jobs="", window=6, round_s=300.0)
    settings = PPOSettings(sources=(source,), slots=4, max_steps=4, forecast=False)
    env = make_train_env(asdict(settings))
    assert len(env.envs) == DRAWN_CLUSTERS
    assert env.weights.sum() == pytest.approx(1.0)
    shapes = {
        tuple(sorted(Counter(n.gpu_model for n in e.sim_config.nodes).items())) for e in env.envs
    }
    assert len(shapes) > DRAWN_CLUSTERS // 2  # different clusters, not one repeated
    # Every sampler draws the same clusters (their shapes come from the seed alone).
    other: Any = make_train_env({**asdict(settings), "worker_index": 1})
    assert [e.sim_config.nodes for e in other.envs] == [e.sim_config.nodes for e in env.envs]
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        sim: Any = env.current.sim
        gpus = sum(n.gpu_count for n in sim.nodes)
        # Half the episode's jobs (6 per 32 GPUs, at most 8x) wait at the start.
        assert len(sim.jobs) == round(6 * min(8.0, max(1.0, gpus / 32))) // 2
        obs, reward, *_ = env.step(env.action_space.sample())
        assert np.isfinite(reward)
