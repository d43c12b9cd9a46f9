"""``autotune replay train``: RLlib's BC and MARWIL on an export of the daemon's logged run
(``logged_export``), the imitation loss over the action entries that mattered, the
simulator fine-tuning, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import cli

from autotune.daemon.tick import Daemon
from autotune.envs.cluster_env import ClusterEnv
from autotune.policies.ppo import MODULE_PATH, SlotPolicyModule, module_dir
from autotune.policies.replay.train import returns_to_go
from autotune.policies.serving import (
    LearnedPolicy,
    PolicyServer,
    checkpoint_hash,
    default_policy_checkpoint,
)
from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import HEADER, SLOT

Export = tuple[str, Path, Daemon]


def _agreement(server: PolicyServer, export: Path) -> float:
    """Share of the logged entries that mattered that the server's greedy action takes."""
    manifest = json.loads((export / "manifest.json").read_text())
    table = pq.read_table(export / manifest["files"][0])
    obs = np.stack(table.column("obs").to_numpy(zero_copy_only=False)).astype(np.float32)
    actions = np.stack(table.column("actions").to_numpy(zero_copy_only=False))
    mask = np.stack(table.column("action_mask").to_numpy(zero_copy_only=False))
    logits = server.logits(obs)
    bounds = np.cumsum((0, *ACTION_DIMS))
    greedy = np.stack(
        [logits[:, bounds[d] : bounds[d + 1]].argmax(1) for d in range(len(ACTION_DIMS))], 1
    )
    return float(((greedy == actions) & mask).sum() / mask.sum())


def _fresh_module(path: Path) -> Path:
    """A randomly initialised one-slot policy checkpoint."""
    torch.manual_seed(1)
    module = SlotPolicyModule(
        observation_space=gym.spaces.Box(0.0, 1.0, (HEADER + len(SLOT),), np.float32),
        action_space=gym.spaces.MultiDiscrete(list(ACTION_DIMS)),
        model_config={"hidden": 64},
    )
    module.save_to_path(path)
    return path


def test_returns_to_go_discount_each_episode_in_step_order() -> None:
    episodes = np.array(["b", "a", "a", "b", "a"])
    steps = np.array([1, 2, 0, 0, 1])
    rewards = np.array([1.0, 4.0, 1.0, 2.0, 2.0])
    out = returns_to_go(episodes, steps, rewards, 0.5)
    # a: steps 0, 1, 2 -> rewards 1, 2, 4; b: steps 0, 1 -> rewards 2, 1
    assert out.tolist() == [1.0, 4.0, 1.0 + 0.5 * (2.0 + 0.5 * 4.0), 2.0 + 0.5, 2.0 + 0.5 * 4.0]


def test_the_loss_counts_only_the_entries_that_mattered() -> None:
    from autotune.policies.replay.learner import masked_log_likelihood

    logits = torch.randn(3, sum(ACTION_DIMS), requires_grad=True)
    actions = torch.tensor([[1, 2, 0, 3, 1, 0, 1], [0, 5, 4, 6, 2, 3, 0], [1, 0, 0, 0, 0, 0, 0]])
    mask = torch.tensor(
        [[1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool
    )
    masked = masked_log_likelihood(logits, actions, mask)
    masked.sum().backward()  # type: ignore[no-untyped-call]
    assert logits.grad is not None
    parts = torch.split(logits.grad, list(ACTION_DIMS), dim=-1)
    for d, grad in enumerate(parts):
        assert torch.all((grad.abs().sum(-1) > 0) == mask[:, d])
    full = masked_log_likelihood(logits.detach(), actions, None)
    # Row 3 counts every entry; row 1 only `change`.
    assert masked[2].item() == pytest.approx(full[2].item(), rel=1e-6)
    change = torch.log_softmax(logits.detach()[0, :2], -1)[1]
    assert masked[0].item() == pytest.approx(change.item(), rel=1e-6)


def _report(stdout: str) -> dict[str, Any]:
    """The command's JSON report: its last line. Ray's driver may print a raylet warning
    ("N PYTHON worker processes have been started") to the same stream first."""
    report: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return report


@pytest.mark.ray
@pytest.mark.slow
def test_bc_imitates_the_logged_decisions(logged_export: Export, tmp_path: Path) -> None:
    """From a random start, a few BC steps make the greedy action take most of the
    logged entries; the output is a checkpoint serving loads, named by its content."""
    _, export, _ = logged_export
    start = _fresh_module(tmp_path / "fresh")
    out = tmp_path / "bc"
    run = cli(
        "replay", "train", "--data", str(export), "--algo", "bc", "--init", str(start),
        "--iterations", "30", "--batch-size", "128", "--lr", "3e-3", "--out", str(out),
        "--json",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-3000:]
    report = _report(run.stdout)
    assert report == json.loads((out / "train.json").read_text())
    assert report["algo"] == "bc"
    assert report["init"]["hash"] == checkpoint_hash(start)
    assert report["data"]["rows"] == json.loads((export / "manifest.json").read_text())["rows"]
    assert len(report["history"]) == report["iterations"] == 30
    losses = [row["policy_loss"] for row in report["history"]]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert report["sim_finetune"] is None

    assert module_dir(out) == out / MODULE_PATH
    server = PolicyServer(out, slots=16)
    assert isinstance(server.module, SlotPolicyModule)
    assert report["hash"] == checkpoint_hash(out / MODULE_PATH)
    assert LearnedPolicy(out, slots=16, forecast=False).content_hash == report["hash"]
    before = _agreement(PolicyServer(start, slots=1), export)
    after = _agreement(server, export)
    assert after > before + 0.15, (before, after)
    assert after > 0.6
    assert report["agreement"]["init"] == pytest.approx(before)
    assert report["agreement"]["offline"] == pytest.approx(after)


@pytest.mark.ray
@pytest.mark.slow
def test_marwil_then_ppo_on_the_logged_workload(logged_export: Export, tmp_path: Path) -> None:
    """MARWIL from the shipped policy, then one PPO iteration in the simulator on the
    export's workload; the result acts for any slot count."""
    _, export, _ = logged_export
    out = tmp_path / "marwil"
    run = cli(
        "replay", "train", "--data", str(export), "--algo", "marwil", "--iterations", "3",
        "--batch-size", "64", "--sim-finetune", "1", "--sim-train-batch", "32",
        "--sim-max-steps", "16", "--out", str(out), "--json",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr[-3000:]
    report = _report(run.stdout)
    assert report["init"]["hash"] == checkpoint_hash(default_policy_checkpoint())
    assert [row["iteration"] for row in report["history"]] == [1, 2, 3]
    assert all(np.isfinite(row["vf_loss"]) for row in report["history"])
    tuned = report["sim_finetune"]
    assert (
        tuned["energy_weight"]
        == json.loads((export / "manifest.json").read_text())["energy_weight"]
    )
    assert len(tuned["history"]) == 1
    assert np.isfinite(tuned["history"][0]["episode_return_mean"])
    assert set(report["seconds"]) >= {"offline", "sim_finetune", "total"}
    # Started from the logging policy: it still takes most logged entries.
    assert report["agreement"]["final"] > 0.8
    assert report["hash"] != report["init"]["hash"]

    server = PolicyServer(out, slots=16)
    env = ClusterEnv(slots=16, n_jobs=8, max_steps=4)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        action = server.act(obs)
        assert env.action_space.contains(action)
        obs, *_ = env.step(action)


def _copy_export(export: Path, to: Path) -> Path:
    shutil.copytree(export, to)
    return to


def _edit_manifest(folder: Path, **changes: object) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(changes)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such folder"),
        ("empty", "no manifest.json"),
        ("format", "manifest format 'autotune-replay/0'"),
        ("no-rows", "no transitions"),
        ("lost-file", "missing"),
        ("init", "cannot load an RLModule"),
        ("algo", "algorithm 'dqn'"),
        ("teacher", "teacher 'sage'"),
    ],
)
def test_bad_input_ends_with_one_line_and_exit_code_2(
    logged_export: Export, tmp_path: Path, case: str, message: str
) -> None:
    _, export, _ = logged_export
    data = tmp_path / "data"
    extra: list[str] = []
    if case == "empty":
        data.mkdir()
    elif case == "format":
        _edit_manifest(_copy_export(export, data), format="autotune-replay/0")
    elif case == "no-rows":
        _edit_manifest(_copy_export(export, data), files=[])
    elif case == "lost-file":
        _copy_export(export, data)
        for file in data.glob("*.parquet"):
            file.unlink()
    elif case == "init":
        _copy_export(export, data)
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "module_state.pkl").write_text("not a checkpoint")
        extra = ["--init", str(tmp_path / "junk")]
    elif case == "algo":
        _copy_export(export, data)
        extra = ["--algo", "dqn"]
    elif case == "teacher":
        _copy_export(export, data)
        extra = ["--sim-teacher", "sage"]
    run = cli("replay", "train", "--data", str(data), "--out", str(tmp_path / "out"), *extra)
    assert run.exit_code == 2, run.output
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert not (tmp_path / "out").exists()
