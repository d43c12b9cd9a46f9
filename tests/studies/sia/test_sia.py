"""The Sia-compatible world on a small artifact folder in Sia's format, written here:
per-type physics with Sia's batch split and slowdown, its restart cost and clock, the
shared first-come-first-served baseline, and the comparison with Sia's own runs."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from helpers import cli

from autotune.benchmarks.sia_against import main as sia_against
from autotune.benchmarks.sia_compat import main as sia_compat
from autotune.benchmarks.sia_learned import main as sia_learned
from autotune.core import JobConfig, Layout, NodeInfo
from autotune.envs.simulator import SimulatedCluster
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.policies.evaluate import run_episode
from autotune.policies.ppo import SlotPolicyModule, _demonstrations
from autotune.policies.ppo_settings import PPOSettings, TraceSource, world
from autotune.policies.serving import IncompatiblePolicyError, PolicyServer
from autotune.studies.pollux.env import decode_weights
from autotune.studies.pollux.trace import TraceApp, read_trace_app
from autotune.studies.sia.fidelity import compare, play, sia_jcts
from autotune.studies.sia.goodput import FAIRNESS_P as SIA_P
from autotune.studies.sia.goodput import SiaGoodputPolicy
from autotune.studies.sia.learned import QUANTUM, SiaCompatEnv, SiaLearnedPolicy
from autotune.studies.sia.learned import WORLD as SIA_WORLD
from autotune.studies.sia.protocol import fold, table
from autotune.studies.sia.trace import SIA_SLOWDOWNS, load_sia_apps
from autotune.studies.sia.world import sia_arrivals, sia_env, sia_nodes

# Step time of one micro-step at local batch 32 on one GPU, per Sia type.
BASE = {"aws": 1.0, "rtx": 0.8, "dgx-ext": 0.4}
PER_NODE = {"aws": 4, "rtx": 8, "dgx-ext": 8}


def _csv(path: Path, header: str, rows: list[tuple[object, ...]]) -> None:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))


def _artifact(root: Path) -> Path:
    """A ``sia-simulator`` folder with bert (two epochs) measured on Sia's three types."""
    folder = root / "sia-simulator"
    bert = folder / "traces" / "bert"
    bert.mkdir(parents=True)
    head = "progress,iteration,grad_sqr,grad_var"
    _csv(bert / "validation-32.csv", head, [(2000.0, 50, 1.0, 1.0), (4000.0, 100, 1.0, 1.0)])
    _csv(bert / "validation-128.csv", head, [(2200.0, 20, 1.0, 1.0), (4400.0, 40, 1.0, 1.0)])
    for suffix, base in BASE.items():
        per = PER_NODE[suffix]
        rows: list[tuple[object, ...]] = []
        for placement in ("1", "2", "4", str(per) * 2) + (("8",) if per == 8 else ()):
            gpus = sum(map(int, placement))
            # "2" measured up to 16 samples per GPU only: a batch of 64 accumulates there.
            top = 16 if placement == "2" else 32
            for local in (8, top):
                step = base * (0.5 + local / 64) + 0.01 * gpus
                rows.append((placement, local, round(step, 4), round(0.2 * step, 4)))
        _csv(bert / f"placements-{suffix}.csv", "placement,local_bsz,step_time,sync_time", rows)
        scal = [
            (nodes, replicas, local, round(base * (0.5 + local / 64) + 0.05 * nodes, 4), 0.1)
            for nodes in (1, 2, 3, 4)
            for replicas in range(nodes, nodes * per + 1)
            for local in (8, 32)
        ]
        _csv(
            bert / f"scalability-{suffix}.csv",
            "num_nodes,num_replicas,local_bsz,step_time,sync_time",
            scal,
        )
    return folder


@pytest.fixture
def sia(tmp_path: Path) -> Path:
    return _artifact(tmp_path)


def _workload(sia: Path, rows: list[tuple[str, float, int, int]]) -> Path:
    path = sia / "workloads" / "test" / "workload-1.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    _csv(
        path,
        "name,time,application,num_replicas,batch_size",
        [(name, t, "bert", gpus, batch) for name, t, gpus, batch in rows],
    )
    return path


def test_each_type_has_its_own_measurements(sia: Path) -> None:
    bert = load_sia_apps(sia)["bert"]
    assert sorted(bert.types) == ["A100M40", "RTX2080Ti", "T4"]
    assert bert.work == 4000.0  # the least progress any validated batch needed
    assert bert.restart_s == 120.0  # bert's rescale_time
    fast = bert.samples_per_s("A100M40", (1,), 32)
    slow = bert.samples_per_s("T4", (1,), 32)
    assert fast / slow == pytest.approx(BASE["aws"] / BASE["dgx-ext"], rel=0.05)
    with pytest.raises(ValueError, match="not measured on 'H100'"):
        bert.on("H100")


def test_the_batch_split_is_sias(sia: Path) -> None:
    t4 = load_sia_apps(sia)["bert"].on("T4")
    # Its own placement's largest local batch: 64 on "2" (measured to 16) accumulates.
    split = t4.split_on((2,), 64)
    assert (split.atomic, split.accum_steps, split.batch) == (16, 1, 64)
    # An unmeasured placement: the largest local batch at as many nodes and replicas or
    # more in scalability (32), so 6 GPUs on (4, 2) take 96 in one step.
    assert t4.max_local_on((4, 2)) == 32
    split = t4.split_on((4, 2), 96)
    assert (split.atomic, split.accum_steps) == (16, 0)
    # One GPU above the initial batch accumulates at least once.
    split = t4.split_on((1,), 64)
    assert (split.atomic, split.accum_steps, split.batch) == (32, 1, 64)


def test_the_slowdown_divides_the_rate(sia: Path) -> None:
    folder = sia / "traces" / "bert"
    plain = read_trace_app(folder, max_epochs=2, suffix="-aws", kind=TraceApp)
    slowed = load_sia_apps(sia)["bert"].on("T4")
    assert slowed.slowdown == SIA_SLOWDOWNS["bert"]
    expected = plain.rate((4,), 128, 0) / SIA_SLOWDOWNS["bert"]
    assert slowed.rate((4,), 128, 0) == pytest.approx(expected)


def test_a_job_advances_on_the_type_it_runs_on(sia: Path) -> None:
    bert = load_sia_apps(sia)["bert"]
    config = JobConfig(layout=Layout(world_size=4))
    a100 = bert.advance("j", 0.0, config, (4,), 128, 60.0, gpu_model="A100M40")
    t4 = bert.advance("j", 0.0, config, (4,), 128, 60.0, gpu_model="T4")
    assert a100.reached > t4.reached > 0
    with pytest.raises(ValueError, match="not measured"):
        bert.advance("j", 0.0, config, (4,), 128, 60.0, gpu_model="H100")


def test_a_folder_without_sias_traces_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="sia-simulator"):
        load_sia_apps(tmp_path)
    (tmp_path / "traces").mkdir()
    with pytest.raises(InputError, match="none of Sia's applications"):
        load_sia_apps(tmp_path)


def test_the_cluster_is_sias() -> None:
    nodes = sia_nodes()
    by_model: dict[str, list[int]] = {}
    for node in nodes:
        by_model.setdefault(node.gpu_model, []).append(node.gpu_count)
    assert by_model == {"T4": [4] * 6, "RTX2080Ti": [8] * 3, "A100M40": [8] * 2}


def test_a_lone_job_starts_at_the_next_round_and_pays_its_restart(sia: Path) -> None:
    """Submitted at 10 s, first seen by the policy at the 60 s round, on the fastest
    type (A100), 120 s without progress, then its epochs as the physics run them."""
    workload = _workload(sia, [("bert-0", 10.0, 4, 128)])
    result = play(workload, sia)
    assert result["finished"] == 1
    assert result["restarts"] == 0
    assert result["placements"]["bert-0"] == ["dgx-ext", [4]]
    physics = load_sia_apps(sia)["bert"].on("A100M40")
    _, run_s = physics.run(0.0, (4,), 128, math.inf)
    assert run_s is not None
    # Sia's clock ends each epoch at a whole second of the round it falls in.
    assert result["jcts_s"]["bert-0"] == pytest.approx(60 + 120 + run_s - 10, abs=2)


def test_first_come_first_served_on_the_fastest_type_with_room(sia: Path) -> None:
    """Three jobs of 16 GPUs arrive together: the A100s take the first, the RTX the
    second (faster than the T4 here), the T4 the third; a fourth of 12 GPUs then finds
    no type with room and waits while a fifth of 4 starts (backfill) on the RTX left."""
    rows = [(f"bert-{i}", 0.0, 16, 128) for i in range(3)]
    rows += [("bert-3", 0.0, 12, 128), ("bert-4", 0.0, 4, 128)]
    result = play(_workload(sia, rows), sia)
    first = result["placements"]
    assert first["bert-0"] == ["dgx-ext", [8, 8]]
    assert first["bert-1"] == ["rtx", [8, 8]]
    assert first["bert-2"] == ["aws", [4, 4, 4, 4]]
    assert first["bert-4"] == ["rtx", [4]]
    started = result["started_s"]
    assert started["bert-4"] == started["bert-0"] == 0.0
    assert started["bert-3"] > 0.0
    assert result["finished"] == 5


def test_the_comparison_with_sias_runs(sia: Path, tmp_path: Path) -> None:
    rows = [(f"bert-{i}", 30.0 * i, 4 + 4 * (i % 2), 128) for i in range(6)]
    workload = _workload(sia, rows)
    ours = play(workload, sia)
    same = compare(ours, ours)
    assert same["relative_difference"] == 0.0
    assert same["jobs_within_1s"] == same["same_first_placement"] == 6
    slower = dict(ours, jcts_s={j: t * 1.1 for j, t in ours["jcts_s"].items()})
    assert compare(ours, slower)["relative_difference"] == pytest.approx(1 / 1.1 - 1, abs=1e-4)
    with pytest.raises(ValueError, match="differ in their jobs"):
        compare(ours, dict(ours, jcts_s={"other": 1.0}))
    # The benchmark reads what Sia's simulator reported (here: our own run, in the
    # anchor script's format) and sets the two side by side.
    anchor = tmp_path / "anchor.json"
    entry = {"path": str(workload), **{k: ours[k] for k in ("jcts_s", "placements")}}
    anchor.write_text(json.dumps({"workloads": {"workload-1": entry}}))
    out = tmp_path / "report.json"
    argv = ["--sia", str(sia), "--anchor", str(anchor), "--workloads", "test/workload-1.csv"]
    assert sia_compat([*argv, "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["workloads"]["test/workload-1.csv"]["relative_difference"] == 0.0
    assert report["largest_relative_difference"] == 0.0


def test_a_workload_of_another_application_is_refused(sia: Path) -> None:
    path = sia / "workloads" / "x.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    _csv(
        path, "name,time,application,num_replicas,batch_size", [("cifar10-0", 0, "cifar10", 1, 128)]
    )
    with pytest.raises(InputError, match="not one of Sia's applications"):
        sia_arrivals(path, sia)


def test_the_eval_command(sia: Path) -> None:
    workload = _workload(sia, [("bert-0", 10.0, 4, 128), ("bert-1", 20.0, 8, 128)])
    result = cli("sia", "eval", "--workload", str(workload), "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["finished"] == 2
    assert report["placements"]["bert-1"] == ["dgx-ext", [8]]
    text = cli("sia", "eval", "--workload", str(workload), "--sia", str(sia))
    assert "2/2 jobs finished, average JCT" in text.stdout
    missing = cli("sia", "eval", "--workload", str(sia / "none.csv"))
    assert missing.exit_code == 2
    assert "no such workload file" in missing.stderr
    mixed = cli(
        "sia", "eval", "--workload", str(workload), "--policy", "goodput", "--mix-gpu-types"
    )
    assert mixed.exit_code == 0, mixed.stderr
    assert "of busy GPU-rounds across types" in mixed.stdout
    rigid = cli("sia", "eval", "--workload", str(workload), "--mix-gpu-types")
    assert rigid.exit_code == 2
    assert "only the goodput optimiser" in rigid.stderr


def test_the_goodput_optimiser_sizes_elastic_jobs_per_type(sia: Path) -> None:
    """Elastic, its type, count and batch chosen every round: a lone job takes more of
    the fastest type than the 4 GPUs it asked for and finishes sooner than on them; a
    stream of jobs all finish, each started on the type the optimiser chose."""
    lone = _workload(sia, [("bert-0", 0.0, 4, 128)])
    rigid = play(lone, sia, policy="fifo")
    elastic = play(lone, sia, policy="goodput")
    model, ranks = elastic["placements"]["bert-0"]
    assert model == "dgx-ext"
    assert sum(ranks) > 4
    assert elastic["avg_jct_h"] < rigid["avg_jct_h"]
    stream = play(
        _workload(sia, [(f"bert-{i}", 40.0 * i, 4, 128) for i in range(6)]), sia, policy="goodput"
    )
    assert stream["finished"] == 6
    assert {where[0] for where in stream["placements"].values()} <= {"dgx-ext", "rtx", "aws"}


def test_sia_arrivals_are_rigid_or_elastic(sia: Path) -> None:
    workload = _workload(sia, [("bert-0", 0.0, 4, 128)])
    (rigid,) = sia_arrivals(workload, sia)
    (elastic,) = sia_arrivals(workload, sia, elastic=True)
    assert (rigid.spec.min_gpus, rigid.spec.max_gpus) == (4, 4)
    # Up to the largest validated batch over the smallest local batch measured (128/8).
    assert (elastic.spec.min_gpus, elastic.spec.max_gpus) == (1, 16)
    assert elastic.spec.requested_gpus == 4
    with pytest.raises(ValueError, match="policy='other'"):
        play(workload, sia, policy="other")


def test_against_sias_own_log(sia: Path, tmp_path: Path) -> None:
    """``bench/sia_against.py`` reads Sia's ``--output`` log (one JSON record per round,
    the last with every job's times: here written from our own run) and sets our
    policies' JCTs beside it, job by job."""
    rows = [(f"bert-{i}", 30.0 * i, 4, 128) for i in range(4)]
    workload = _workload(sia, rows)
    fifo = play(workload, sia, policy="fifo")
    runs = tmp_path / "runs"
    runs.mkdir()
    jobs = [
        {"name": n, "submission_time": 30.0 * i, "completion_time": 30.0 * i + fifo["jcts_s"][n]}
        for i, n in enumerate(sorted(fifo["jcts_s"]))
    ]
    first = {"timestamp": 60, "submitted_jobs": [dict(j, completion_time=None) for j in jobs]}
    last = {"timestamp": 99999, "submitted_jobs": jobs}
    (runs / "workload-1.log").write_text(json.dumps(first) + "\n" + json.dumps(last) + "\n")
    assert sia_jcts(runs / "workload-1.log") == pytest.approx(fifo["jcts_s"])
    out = tmp_path / "against.json"
    argv = ["--sia", str(sia), "--sia-runs", str(runs), "--workloads", "test/workload-1.csv"]
    assert sia_against([*argv, "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    row = report["workloads"]["test/workload-1.csv"]
    assert row["fifo"]["paired_difference"] == [0.0, 0.0, 0.0]
    assert report["pooled"]["goodput"]["workloads"] == 1
    # With --mix, the optimiser across types too, paired against it on one type.
    assert sia_against([*argv, "--mix", "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    mixed = report["workloads"]["test/workload-1.csv"]["goodput-mixed"]
    assert len(mixed["vs_goodput"]) == 3
    assert 0.0 <= mixed["mixed_gpu_rounds"] <= 1.0
    assert report["pooled"]["mixed_vs_goodput"]["workloads"] == 1
    assert report["mixed_step_check"]["rows"] > 0
    with pytest.raises(SystemExit, match="2"):
        sia_against([*argv, "--mix", "--policies", "fifo"])
    # A workload without Sia's log is left out; none left is an error.
    (runs / "workload-1.log").unlink()
    assert sia_against(argv) == 1


def test_running_jobs_give_gpus_up_to_newcomers(sia: Path) -> None:
    """A lone job takes many A100; when seven more arrive it gives some up (a change
    that lowers a job's own goodput is not held back by its restart cost; only one that
    raises it must pay for it)."""
    rows = [("bert-0", 0.0, 4, 128)] + [(f"bert-{i}", 300.0, 4, 128) for i in range(1, 8)]
    env = sia_env(sia_arrivals(_workload(sia, rows), sia, elastic=True))
    sizes: list[tuple[float, str, int]] = []
    models = {node.node_id: node.gpu_model for node in env.nodes}

    def seen(decided_on: ClusterSnapshot, sim: SimulatedCluster) -> None:
        status = sim.jobs["bert-0"].status
        if status.state == "running" and status.placement is not None:
            model = models[status.placement.ranks[0].node_id]
            sizes.append((decided_on.time_s, model, len(status.placement.ranks)))

    run_episode(SiaGoodputPolicy(env), env, seed=0, on_round=seen)
    before = [n for t, m, n in sizes if t < 300 and m == "A100M40"]
    after = [n for t, _, n in sizes if t >= 300]
    assert before
    assert max(before) > 4  # more than it asked for
    assert after
    assert min(after) < max(before)


def test_a_rigid_job_larger_than_every_type_is_refused(sia: Path) -> None:
    workload = _workload(sia, [("bert-0", 0.0, 32, 128)])
    with pytest.raises(InputError, match="more than any GPU type"):
        sia_arrivals(workload, sia)
    assert sia_arrivals(workload, sia, elastic=True)[0].spec.min_gpus == 1


# -- the learned policy's world ------------------------------------------------------


def _source(workload: Path, sia: Path) -> TraceSource:
    return TraceSource(jobs=str(workload), kind="sia-compat", traces=str(sia))


def _stream(sia: Path, n: int = 6) -> Path:
    """Jobs of different sizes (so of different remaining work), arriving together."""
    return _workload(sia, [(f"bert-{i}", 30.0 * i, 1 + i % 4, 64 * (1 + i % 2)) for i in range(n)])


def test_the_optimisers_decision_is_its_allocation_at_its_weights(sia: Path) -> None:
    """``decide`` is ``allocate`` at ``weights``: what a learned policy's corrected
    weights go through; at exponent 0 every job weighs 1, above it the jobs with less
    work left weigh more, and a job weighted up gets more GPUs."""
    env = sia_env(sia_arrivals(_stream(sia), sia, elastic=True))
    env.reset(seed=0)
    for _ in range(4):
        env.step_choices({})
    snapshot = env.snapshot
    assert snapshot is not None
    plain, sized = SiaGoodputPolicy(env), SiaGoodputPolicy(env, exponent=1.0)
    assert set(plain.weights(snapshot).values()) == {1.0}
    weights = sized.weights(snapshot)
    assert len(set(weights.values())) > 1
    assert sized.decide(snapshot).choices == sized.allocate(snapshot, weights)

    def gpus(choices: dict[str, PolicyChoice], job_id: str) -> int:
        config = choices[job_id].config
        return config.world_size if config is not None else 0

    job_id = min(weights, key=weights.__getitem__)
    before = plain.allocate(snapshot, {})
    after = plain.allocate(snapshot, {job_id: 64.0})
    assert gpus(after, job_id) > gpus(before, job_id)


def test_the_zero_residual_plays_exactly_as_its_teacher_in_sias_world(sia: Path) -> None:
    """The ``sia-compat`` world: an action near zero (rounded to ``QUANTUM``) is the
    teacher ``sia-goodput`` at its exponent, job by job; the teacher's demonstrations
    are all zero corrections; the reward is minus the round's job-hours."""
    workload = _stream(sia)
    settings = PPOSettings(
        slots=4,
        sources=(_source(workload, sia),),
        warm_start="sia-goodput",
        world_options={"size_exponent": 0.5},
    )
    found = world("sia-compat")
    assert found is not None
    assert found.kind == SIA_WORLD.kind == "sia-compat"
    env = SIA_WORLD.make_env(settings.sources[0], settings, None)
    assert isinstance(env, SiaCompatEnv)
    env.reset(seed=0)
    total = 0.0
    while True:
        near_zero = np.full(env.slots, 0.4 * QUANTUM, np.float32)
        *_, reward, terminated, truncated, _ = env.step(near_zero)
        total += float(reward)
        if terminated or truncated:
            break
    assert env.sim is not None
    by_action = {j.job_id: j.status.finished_s for j in env.sim.jobs.values()}
    teacher = play(workload, sia, policy=lambda e: SiaGoodputPolicy(e, exponent=0.5))
    assert by_action == {
        job: teacher["jcts_s"][job] + 30.0 * int(job.split("-")[1]) for job in by_action
    }
    assert total == pytest.approx(-sum(teacher["jcts_s"].values()) / 3600, rel=0.05)
    _, actions, occupied, _ = _demonstrations(settings, "sia-goodput", 1)
    assert occupied.sum() > 0
    assert not actions.any()
    with pytest.raises(ValueError, match="sia-simulator"):
        SIA_WORLD.make_env(replace(settings.sources[0], traces=None), settings, None)


def test_corrections_are_rounded_to_the_quantum(sia: Path) -> None:
    env = sia_env(sia_arrivals(_stream(sia, 3), sia, elastic=True), slots=4)
    env.reset(seed=0)
    env.step_choices({})
    snapshot = env.snapshot
    assert snapshot is not None
    ids = [j.spec.job_id for j in snapshot.queue_order()]
    q = QUANTUM
    action = np.array([0.4 * q, 0.8 * q, -2.1 * q, 0.0])
    weights = decode_weights(action, snapshot, 4, quantum=q)
    assert [weights[i] for i in ids[:3]] == pytest.approx([1.0, 2**q, 2 ** (-2 * q)])
    with pytest.raises(ValueError, match="quantum"):
        decode_weights(action, snapshot, 4, quantum=0.0)


def test_a_fold_is_not_taken_from_a_run_with_other_settings(sia: Path, tmp_path: Path) -> None:
    """A fold's result is reused only for the same iterations and step; the folder of a
    run that stopped before its result is not selected from (it is trained afresh)."""
    (tmp_path / "fold-a-seed-0.json").write_text(
        json.dumps({"training": {"ppo_iterations": 24}, "quantum": 0.25})
    )
    with pytest.raises(ValueError, match="another output folder"):
        fold(sia, "a", 0, tmp_path, iterations=40, train_batch=64, quantum=0.05)
    kept = fold(sia, "a", 0, tmp_path, iterations=24, train_batch=64, quantum=0.25)
    assert kept["quantum"] == 0.25


def test_the_served_policy_plays_through_sias_allocation(sia: Path, tmp_path: Path) -> None:
    workload = _stream(sia)
    settings = PPOSettings(slots=4, sources=(_source(workload, sia),))
    env = SIA_WORLD.make_env(settings.sources[0], settings, None)
    module = SlotPolicyModule(
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"hidden": 8},
    )
    module.save_to_path(tmp_path / "module")
    sized = replace(settings, world_options={"size_exponent": 1.0, "quantum": 0.25})
    SIA_WORLD.save_beside(tmp_path / "module", sized)
    server = PolicyServer(tmp_path / "module", slots=4, continuous=True)
    result = play(workload, sia, policy=lambda e: SiaLearnedPolicy(e, server, forecast="none"))
    assert result["finished"] == 6
    policy = SiaLearnedPolicy(sia_env([]), server, forecast="none")
    assert policy.version.startswith("ppo-sia-")
    assert isinstance(policy.allocator, SiaGoodputPolicy)
    assert (policy.allocator.exponent, policy.allocator.p) == (1.0, SIA_P)
    assert policy.quantum == 0.25
    # The same module from the command line; --policy ppo needs the module.
    args = ("sia", "eval", "--workload", str(workload), "--policy", "ppo")
    run = cli(*args, "--policy-checkpoint", str(tmp_path / "module"), "--json")
    assert run.exit_code == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["finished"] == 6
    assert cli(*args).exit_code == 2
    module = ("--policy-checkpoint", str(tmp_path / "module"))
    assert cli(*args, *module, "--interval", "30").exit_code == 2  # it trained on 60 s rounds
    # A module of the Pollux-compatible world is refused here.
    pollux_saved = tmp_path / "module" / "allocation.json"
    pollux_saved.write_text(json.dumps({"world": "pollux-compat", "fairness_p": -1.0}))
    with pytest.raises(IncompatiblePolicyError, match="pollux-compat world"):
        SiaLearnedPolicy(sia_env([]), server, forecast="none")
    # Saved without an allocation: Sia's p, the residual-free policy, the default step.
    pollux_saved.unlink()
    bare = SiaLearnedPolicy(sia_env([]), server, forecast="none")
    assert (bare.fairness_p, bare.residual_exponent, bare.quantum) == (SIA_P, None, QUANTUM)


def test_the_learned_table_sets_each_held_out_workload_against_sia(
    sia: Path, tmp_path: Path
) -> None:
    """``bench/sia_learned.py --table``: per held-out workload, Sia's average from its
    log, the teacher's and the chosen checkpoint's, and the per-job differences."""
    workload = _stream(sia, 4)
    teacher = play(workload, sia, policy="goodput")
    slower = {job: jct + 360.0 for job, jct in teacher["jcts_s"].items()}
    fold_result = {
        "fold": "a",
        "chosen": "ppo-8",
        "tested": {
            "test/workload-1.csv": {
                "ppo-8": {"avg_jct_h": teacher["avg_jct_h"], "jcts_s": teacher["jcts_s"]},
                "teacher": {"avg_jct_h": teacher["avg_jct_h"] + 0.1, "jcts_s": slower},
            }
        },
    }
    out = tmp_path / "out"
    out.mkdir()
    (out / "fold-a-seed-0.json").write_text(json.dumps(fold_result))
    runs = tmp_path / "runs" / "test"
    runs.mkdir(parents=True)
    jobs = [
        {"name": job, "submission_time": 0.0, "completion_time": jct} for job, jct in slower.items()
    ]
    (runs / "workload-1.log").write_text(json.dumps({"submitted_jobs": jobs}) + "\n")
    text = table(out, tmp_path / "runs")
    row = next(line for line in text.splitlines() if line.startswith("| test/workload-1.csv"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "a"
    assert float(cells[4]) == pytest.approx(teacher["avg_jct_h"], abs=1e-3)
    # 360 s faster than the teacher and than Sia, job by job.
    assert cells[5].startswith("-")
    assert cells[6].startswith("-")
    with pytest.raises(SystemExit) as refused:
        sia_learned(["--sia", str(sia), "--out", str(out), "--table"])
    assert refused.value.code == 2


# --- one job across GPU types, beyond Sia's world ---


def test_a_step_across_types_gives_each_type_the_share_its_speed_allows(sia: Path) -> None:
    """8 A100 and 8 RTX 2080 Ti on two nodes, a batch of 320: an A100 computes 32
    samples (its largest traced on one GPU) in 0.328 s and an RTX its smallest, 8, in
    0.408 s (the traced step less its 20% sync: 0.8 * (base * (0.5 + local/64) + 0.01)),
    so the shares are 32:8 and the RTX sets the pace; the sync is the slower type's on
    the two-node placement; both times the slowdown."""
    app = load_sia_apps(sia)["bert"]
    step = app.mixed_step((("A100M40", 8), ("RTX2080Ti", 8)), (8, 8), 320)
    shares = dict(step.shares)
    assert shares["A100M40"] == pytest.approx(32, abs=1e-6)
    assert shares["RTX2080Ti"] == pytest.approx(8, abs=1e-6)
    slowdown = SIA_SLOWDOWNS["bert"]
    assert step.compute_s == pytest.approx(0.408 * slowdown, rel=1e-6)
    # placement "88": rtx at local 8 steps 0.8 * 0.625 + 0.16 = 0.66 s, of which 20% sync
    assert step.sync_s == pytest.approx(0.132 * slowdown, rel=1e-6)
    assert step.step_s == pytest.approx(step.compute_s + step.sync_s)
    with pytest.raises(ValueError, match=r"outside the 128\.\.512"):
        app.mixed_step((("A100M40", 8), ("RTX2080Ti", 8)), (8, 8), 100)
    with pytest.raises(ValueError, match="two types or more"):
        app.mixed_step((("A100M40", 8),), (8,), 128)
    # A placement no type traced takes the nearest multi-node point of each type.
    wide = app.mixed_step((("A100M40", 8), ("RTX2080Ti", 8)), (4, 4, 4, 4), 320)
    assert wide.sync_s > 0


def test_a_job_across_types_advances_on_its_mixed_step(sia: Path) -> None:
    app = load_sia_apps(sia)["bert"]
    parts = (("A100M40", 8), ("RTX2080Ti", 8))
    config = JobConfig.data_parallel(16)
    step = app.mixed_step(parts, (8, 8), 128)
    # Below what the types' one-GPU traces hold (8 a rank): run at the smallest, 128.
    ran = app.advance("j", 0.0, config, (8, 8), 100, 1e7, gpu_model="RTX2080Ti", gpu_models=parts)
    assert ran.step_s == pytest.approx(step.step_s)
    assert ran.samples_per_s == pytest.approx(128 / step.step_s)
    assert ran.finished_after_s is not None
    assert ran.reached == pytest.approx(app.work)
    rate = app.advance("j", 0.0, config, (8, 8), 128, 0.0, gpu_model="RTX2080Ti", gpu_models=parts)
    assert rate.reached == 0.0
    assert rate.finished_after_s is None
    half = app.advance("j", 0.0, config, (8, 8), 128, 60.0, gpu_model="RTX2080Ti", gpu_models=parts)
    assert half.reached == pytest.approx(rate.goodput * 60.0)
    fp16 = replace(config, precision=replace(config.precision, ffn="fp16"))
    with pytest.raises(ValueError, match="fp32 without compression"):
        app.advance("j", 0.0, fp16, (8, 8), 128, 60.0, gpu_model="RTX2080Ti", gpu_models=parts)


def test_the_optimiser_splits_a_job_across_types_where_that_beats_one_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One A100 node and one RTX node of 8 each, the RTX nearly as fast as the A100: a
    lone elastic job runs faster on all 16 GPUs across the two types than on the 8 of
    either, so with mixing on it is split so and finishes sooner; without, it never
    mixes."""
    monkeypatch.setitem(BASE, "rtx", 0.45)
    sia = _artifact(tmp_path)
    nodes = [n for n in sia_nodes() if n.node_id in ("dgx-ext-0", "rtx-0")]
    workload = _workload(sia, [("bert-0", 0.0, 4, 128)])
    jct: dict[bool, float] = {}
    seen_models: dict[bool, set[tuple[tuple[str, int], ...]]] = {}
    Recording.again.clear()
    models = {node.node_id: node.gpu_model for node in nodes}
    for mix in (False, True):
        env = sia_env(sia_arrivals(workload, sia, elastic=True), mix=mix, nodes=nodes)
        held: set[tuple[tuple[str, int], ...]] = set()

        def seen(decided_on: ClusterSnapshot, sim: SimulatedCluster, held: set = held) -> None:
            status = sim.jobs["bert-0"].status
            if status.state == "running" and status.placement is not None:
                held.add(tuple(status.placement.ranks_by_model(models).items()))

        result = run_episode(Recording(env), env, seed=0, on_round=seen)
        jct[mix], seen_models[mix] = result["avg_jct_s"], held
    assert all(len(h) == 1 for h in seen_models[False])
    assert (("A100M40", 8), ("RTX2080Ti", 8)) in seen_models[True]
    assert jct[True] < jct[False]
    # Once split, a round that finds it as it is leaves it (a new batch at most, once an
    # epoch: two here).
    assert len(Recording.again) <= 2
    # On one type, the world that mixes plays exactly as the one that does not.
    a100 = [n for n in sia_nodes() if n.gpu_model == "A100M40"]
    stream = _workload(sia, [(f"bert-{i}", 40.0 * i, 4, 128) for i in range(4)])
    one = [play_on(stream, sia, a100, mix=mix)["avg_jct_s"] for mix in (False, True)]
    assert one[0] == one[1]


def play_on(workload: Path, sia: Path, nodes: list[NodeInfo], *, mix: bool) -> dict[str, Any]:
    env = sia_env(sia_arrivals(workload, sia, elastic=True), mix=mix, nodes=nodes)
    return run_episode(SiaGoodputPolicy(env), env, seed=0)


class Recording(SiaGoodputPolicy):
    """Records the batches of the choices that give a running job across types the
    split it already runs on."""

    again: ClassVar[list[int]] = []

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        out = super().decide(snapshot)
        models = {node.node_id: node.gpu_model for node in snapshot.nodes}
        for job in snapshot.by_state("running"):
            choice = out.choices.get(job.spec.job_id)
            if choice is None or choice.gpu_split is None or job.placement is None:
                continue
            held = job.placement.ranks_by_model(models)
            if dict(choice.gpu_split) == held and choice.config is not None:
                Recording.again.append(choice.config.batch(job.spec))
        return out
