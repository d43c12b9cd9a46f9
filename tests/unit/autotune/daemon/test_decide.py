"""The pure decision step: a snapshot, a policy and the active overrides in, the round's
decisions out, with no database and no daemon."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import next_snapshot

from autotune.core import utc_now
from autotune.db.repository import OverrideRecord
from autotune.decision.step import decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import PolicyRound
from autotune.planner import verify_placements
from autotune.policies.rules import RulesPolicy


def _snapshot(seed: int = 0):  # type: ignore[no-untyped-def]
    cluster = SimulatedCluster(SimConfig(seed=seed, initial_jobs=6, max_jobs=6))
    return next_snapshot(cluster)


def _override(job_id: str, pin: dict[str, object], override_id: int = 7) -> OverrideRecord:
    now = utc_now()
    return OverrideRecord(
        override_id=override_id,
        job_id=job_id,
        pin=pin,
        reason="pinned by hand",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        deleted_at=None,
    )


def test_a_round_places_waiting_jobs_validly_and_says_why() -> None:
    snapshot = _snapshot()
    round_ = decide_for(snapshot, RulesPolicy(), {}, honoured={})
    assert round_.decisions, "six jobs wait on an idle 32-GPU cluster"
    specs = [j.spec for j in snapshot.jobs]
    placements = {d.job_id: d.placement for d in round_.decisions if d.placement is not None}
    assert verify_placements(specs, snapshot.nodes, placements) == []
    for decision in round_.decisions:
        assert decision.source == "policy"
        assert "placed on" in decision.reason
        assert round_.why[decision.job_id].override_id is None
        assert round_.why[decision.job_id].explanation["chosen"]["config"]
    decided = {d.job_id for d in round_.decisions}
    assert decided.isdisjoint(round_.unplaced)
    assert decided | set(round_.unplaced) == {j.spec.job_id for j in snapshot.jobs}


def test_the_same_inputs_give_the_same_round() -> None:
    first = decide_for(_snapshot(3), RulesPolicy(), {}, honoured={})
    again = decide_for(_snapshot(3), RulesPolicy(), {}, honoured={})

    def what(decisions):  # type: ignore[no-untyped-def]  # all but the time of deciding
        return [(d.job_id, d.config, d.placement, d.source, d.reason) for d in decisions]

    assert what(first.decisions) == what(again.decisions)
    assert first.unplaced == again.unplaced


def test_an_override_pins_the_config_and_a_broken_one_is_skipped_with_the_reason() -> None:
    snapshot = _snapshot()
    first, second = (j.spec.job_id for j in snapshot.jobs[:2])
    overrides = {
        first: _override(first, {"compression": {"kind": "int8"}}),
        second: _override(second, {"layout": {"world_size": 1, "tp": 2}}, override_id=8),
    }
    round_ = decide_for(snapshot, RulesPolicy(), overrides, honoured={})
    pinned = next(d for d in round_.decisions if d.job_id == first)
    assert pinned.source == "override"
    assert pinned.config.compression.kind == "int8"
    assert round_.why[first].override_id == 7
    assert second in round_.skipped_overrides
    assert round_.skipped_overrides[second].startswith("override 8 not applied")
    assert overrides[second].override_id == 8, "the caller's mapping is not changed"


def test_a_job_interrupted_by_a_lost_node_is_placed_again_saying_so() -> None:
    from dataclasses import replace

    snapshot = _snapshot()
    lost, *rest = snapshot.nodes
    job = replace(snapshot.jobs[0], interrupted=f"node {lost.node_id} lost")
    snapshot = replace(snapshot, nodes=rest, lost_nodes=[lost], jobs=[job, *snapshot.jobs[1:]])
    round_ = decide_for(snapshot, RulesPolicy(), {}, honoured={})
    again = next(d for d in round_.decisions if d.job_id == job.spec.job_id)
    assert again.reason.startswith(f"node {lost.node_id} lost: ")
    assert again.placement is not None
    assert lost.node_id not in {slot.node_id for slot in again.placement.ranks}
    others = [d for d in round_.decisions if d.job_id != job.spec.job_id]
    assert others
    assert not any("lost" in d.reason for d in others)


def test_a_running_job_whose_pinned_config_finds_no_room_keeps_its_gpus() -> None:
    # A full cluster with a queue: the round's decisions and the placements of running
    # jobs without a new decision must never share a GPU, whatever an override asks.
    cluster = SimulatedCluster(SimConfig(seed=1, initial_jobs=40, max_jobs=40))
    for _ in range(3):
        snapshot = next_snapshot(cluster)
        cluster.apply(decide_for(snapshot, RulesPolicy(), {}, honoured={}).decisions)
    snapshot = next_snapshot(cluster)
    assert snapshot.by_state("pending"), "the queue is not empty"
    tried = 0
    for job in snapshot.by_state("running"):
        if job.spec.max_gpus < 2 * job.config.layout.world_size:
            continue
        pin = {"layout": {"world_size": 2 * job.config.layout.world_size}}
        overrides = {job.spec.job_id: _override(job.spec.job_id, pin)}
        round_ = decide_for(snapshot, RulesPolicy(), overrides, honoured={})
        placements = {j.spec.job_id: j.placement for j in snapshot.by_state("running")}
        placements.update({d.job_id: d.placement for d in round_.decisions})
        specs = [j.spec for j in snapshot.jobs]
        problems = verify_placements(specs, snapshot.nodes, placements)
        assert problems == [], (job.spec.job_id, problems[:2])
        if job.spec.job_id not in {d.job_id for d in round_.decisions}:
            assert "keeps its current one" in round_.skipped_overrides[job.spec.job_id]
            tried += 1
    assert tried, "some pin found no room"


class _Silent:
    """A policy that chooses nothing: every waiting job is left to the decision step."""

    name = "silent"
    version = "silent-1"

    def decide(self, snapshot: object) -> PolicyRound:
        return PolicyRound(choices={})


def test_a_waiting_job_the_policy_leaves_out_is_planned_data_parallel_over_its_minimum() -> None:
    snapshot = _snapshot()
    round_ = decide_for(snapshot, _Silent(), {}, honoured={})  # type: ignore[arg-type]
    assert round_.decisions
    for decision in round_.decisions:
        job = next(j for j in snapshot.jobs if j.spec.job_id == decision.job_id)
        assert decision.config.layout.world_size == job.spec.min_gpus
        assert decision.config.layout.dp == job.spec.min_gpus
        assert "not chosen by the policy" in decision.reason


class _Preempt:
    """Stops one running job and starts one waiting job on its GPUs."""

    name = "preempt"
    version = "preempt-test"

    def __init__(self, stop: str, start: str, gpus: int) -> None:
        self.stop, self.start, self.gpus = stop, start, gpus

    def decide(self, snapshot):  # type: ignore[no-untyped-def]
        from autotune.core import JobConfig
        from autotune.interfaces import PolicyChoice, PolicyRound

        choices = {
            j.spec.job_id: PolicyChoice(config=None, reason="not now")
            for j in snapshot.by_state("pending")
        }
        choices[self.stop] = PolicyChoice(config=None, reason="its turn is over", preempt=True)
        choices[self.start] = PolicyChoice(
            config=JobConfig.data_parallel(self.gpus), reason="its turn"
        )
        return PolicyRound(choices=choices)


def _full_cluster():  # type: ignore[no-untyped-def]
    """A 4-GPU cluster running one 4-GPU job, with a second 4-GPU job waiting."""
    from autotune.catalog.profiles import MODEL_CATALOG
    from autotune.core import JobSpec
    from autotune.envs.presets import pollux_nodes
    from autotune.envs.simulator import Arrival

    model = MODEL_CATALOG["resnet-50"]
    arrivals = [
        Arrival(
            spec=JobSpec(
                job_id=name, model=model, global_batch=256, min_gpus=1, max_gpus=4, submitted_at=t
            ),
            duration_s=3600.0,
            reference_gpus=4,
        )
        for name, t in (("first", 0.0), ("second", 10.0))
    ]
    cluster = SimulatedCluster(
        SimConfig(nodes=tuple(pollux_nodes(4)), round_s=60.0, start_s=30.0), arrivals=arrivals
    )
    snapshot = next_snapshot(cluster)
    cluster.apply(
        decide_for(snapshot, _Preempt("none", "first", 4), {}, honoured={}).decisions  # type: ignore[arg-type]
    )
    return cluster


def test_a_preempted_job_frees_its_gpus_for_this_round_and_keeps_its_progress() -> None:
    cluster = _full_cluster()
    snapshot = next_snapshot(cluster)  # one round: "first" ran, "second" arrived
    first = cluster.jobs["first"]
    done = first.done
    assert snapshot.by_state("running")[0].spec.job_id == "first"
    assert done > 0
    round_ = decide_for(snapshot, _Preempt("first", "second", 4), {}, honoured={})  # type: ignore[arg-type]
    by_job = {d.job_id: d for d in round_.decisions}
    assert by_job["first"].preempt
    assert by_job["first"].placement is None
    assert by_job["first"].reason.startswith("preempted: its turn is over")
    assert by_job["first"].config == snapshot.by_state("running")[0].config
    assert not by_job["second"].preempt
    assert by_job["second"].placement is not None
    assert round_.unplaced["first"].startswith("preempted")
    cluster.apply(round_.decisions)
    assert first.status.state == "pending"
    assert first.status.placement is None
    assert first.done == done
    assert first.preemptions == 1
    cluster.advance()
    assert first.done == done  # it waits
    assert cluster.jobs["second"].status.state == "running"


def test_a_preempted_job_waits_without_a_config_until_the_policy_starts_it() -> None:
    cluster = _full_cluster()
    round_ = decide_for(next_snapshot(cluster), _Preempt("first", "second", 4), {}, honoured={})  # type: ignore[arg-type]
    cluster.apply(round_.decisions)
    snapshot = next_snapshot(cluster)
    first = next(j for j in snapshot.jobs if j.spec.job_id == "first")
    assert first.state == "pending"
    assert first.config is None  # not resumed as it ran: the policy starts it again
    # "first" waits ("not now") and "second" keeps running: nothing is placed.
    again = decide_for(snapshot, _Preempt("second", "nobody", 1), {}, honoured={})  # type: ignore[arg-type]
    assert [d.job_id for d in again.decisions if not d.preempt] == []
    assert again.unplaced["first"] == "not now"


def test_a_restarted_job_pays_the_start_downtime() -> None:
    cluster = _full_cluster()
    cluster.advance()
    first = cluster.jobs["first"]
    # The first round began with the 30 s start: 30 of its 60 s trained.
    expected = first.goodput * 30.0
    assert first.done == pytest.approx(expected, rel=1e-6)


def test_a_preemption_is_a_decision_without_placement() -> None:
    from autotune.core import Decision, JobConfig

    with pytest.raises(ValueError, match="preemption places nothing"):
        Decision(
            job_id="a",
            config=JobConfig.data_parallel(1),
            placement=_placement("a"),
            source="policy",
            policy_version="v",
            reason="r",
            preempt=True,
        )


def _placement(job_id: str):  # type: ignore[no-untyped-def]
    from autotune.core import Placement, RankSlot

    return Placement(job_id=job_id, ranks=(RankSlot(rank=0, node_id="n", gpu_index=0),))


def test_a_waiting_job_sized_beyond_any_plan_gets_the_most_one_could_give() -> None:
    """Whatever the policy: 16 GPUs for a job held to one node of a cluster of 8-GPU nodes
    would wait for ever; it gets 8, in the policy's tensor-parallel layout, and the
    decision says why. Without the one-node limit the choice stands."""
    from dataclasses import replace

    from autotune.catalog.devices import node_info
    from autotune.core import JobConfig, JobSpec, Layout
    from autotune.decision.step import decide
    from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice

    nodes = [
        node_info(f"a100-{i}", gpu_model="A100", gpu_count=8, cpu_milli=96_000, memory_mib=1 << 20)
        for i in range(4)
    ]
    spec = JobSpec(job_id="pod", min_gpus=1, max_gpus=16, max_nodes=1)
    snapshot = ClusterSnapshot(
        time_s=0.0, nodes=nodes, jobs=[JobStatus(spec=spec, state="pending")], telemetry="sim"
    )
    config = JobConfig(layout=Layout(world_size=16, tp=2))
    choice = {"pod": PolicyChoice(config=config, reason="the policy's")}
    round_ = decide(snapshot, choice, {}, honoured={}, policy_version="t")
    (decision,) = round_.decisions
    assert decision.config is not None
    assert (decision.config.world_size, decision.config.layout.tp) == (8, 2)
    assert "8 GPU(s) instead of 16: one GPU model it may use holds at most 8" in decision.reason
    spread = replace(
        snapshot, jobs=[JobStatus(spec=replace(spec, max_nodes=None), state="pending")]
    )
    (free,) = decide(spread, choice, {}, honoured={}, policy_version="t").decisions
    assert free.config is not None
    assert free.config.world_size == 16


def test_a_waiting_job_whose_layout_cannot_fit_any_gpu_takes_one_that_does() -> None:
    """Whatever the policy: a 7B model data parallel on 16 GiB GPUs fits under no
    gradient accumulation and would wait for ever; the decision step takes the first
    layout of its size that fits (tensor, then pipeline parallel), keeping the policy's
    precision and compression, and says so."""
    from autotune.catalog.devices import node_info
    from autotune.catalog.profiles import MODEL_CATALOG
    from autotune.core import CompressionSpec, JobConfig, JobSpec, Layout, PrecisionMap
    from autotune.decision.step import decide
    from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice
    from autotune.perf.memory import rank_memory

    nodes = [
        node_info(f"p100-{i}", gpu_model="P100", gpu_count=8, cpu_milli=96_000, memory_mib=1 << 20)
        for i in range(8)
    ]
    model = MODEL_CATALOG["gpt-7b"]
    spec = JobSpec(job_id="big", model=model, global_batch=16, min_gpus=1, max_gpus=32)
    snapshot = ClusterSnapshot(
        time_s=0.0, nodes=nodes, jobs=[JobStatus(spec=spec, state="pending")], telemetry="sim"
    )
    chosen = JobConfig(
        layout=Layout(world_size=4),
        precision=PrecisionMap.uniform("fp16"),
        compression=CompressionSpec(kind="powersgd", rank=4),
    )
    assert not rank_memory(model, chosen, 16).fits(nodes[0].gpu_memory_bytes)
    choice = {"big": PolicyChoice(config=chosen, reason="the policy's")}
    round_ = decide(snapshot, choice, {}, honoured={}, policy_version="t")
    (decision,) = round_.decisions
    config = decision.config
    assert config is not None
    assert config.layout.tp * config.layout.pp > 1
    assert rank_memory(model, config, 16).fits(nodes[0].gpu_memory_bytes)
    assert config.precision == chosen.precision
    # PowerSGD runs on data-parallel layouts only: top-k 1% instead, saying so.
    assert config.compression == CompressionSpec(kind="topk", ratio=0.01)
    assert config.executor_refusal() is None
    assert f"fitting no GPU so, {config.world_size} GPU(s) as dp=" in decision.reason
    assert "topk:0.01 instead of powersgd:4" in decision.reason


def test_a_choice_the_executor_cannot_train_compresses_as_it_can() -> None:
    """PowerSGD with tensor or pipeline parallelism, which the executor refuses, keeps
    its layout and takes top-k 1%; PowerSGD on a data-parallel layout is kept."""
    from autotune.core import CompressionSpec, JobConfig, Layout
    from autotune.decision.step import decide
    from autotune.interfaces import PolicyChoice

    snapshot = _snapshot()
    pending = [j.spec for j in snapshot.jobs if j.state == "pending"][:3]
    powersgd = CompressionSpec(kind="powersgd", rank=4)
    layouts = {
        pending[0].job_id: Layout(world_size=2, dp=1, tp=2),
        pending[1].job_id: Layout(world_size=2, dp=1, pp=2, micro_batches=2),
        pending[2].job_id: Layout(world_size=2),
    }
    choices = {
        job_id: PolicyChoice(config=JobConfig(layout=layout, compression=powersgd), reason="p")
        for job_id, layout in layouts.items()
    }
    assert [c.config.executor_refusal() is None for c in choices.values()] == [  # type: ignore[union-attr]
        False,
        False,
        True,
    ]
    round_ = decide(snapshot, choices, {}, honoured={}, policy_version="t")
    decided = {d.job_id: d for d in round_.decisions}
    assert set(layouts) <= set(decided)  # the others: data parallel, not the policy's
    for job_id, layout in layouts.items():
        config = decided[job_id].config
        assert config is not None
        assert (config.layout.tp, config.layout.pp) == (layout.tp, layout.pp)
        assert config.executor_refusal() is None
        if layout.tp * layout.pp > 1:
            assert config.compression == CompressionSpec(kind="topk", ratio=0.01)
            assert "PowerSGD runs on data-parallel layouts only" in decided[job_id].reason
        else:
            assert config.compression == powersgd


def test_a_precision_slower_than_fp32_wherever_the_job_may_run_trains_in_one_that_pays() -> None:
    from autotune.catalog.devices import node_info
    from autotune.catalog.profiles import MODEL_CATALOG
    from autotune.core import JobConfig, JobSpec, Layout, PrecisionMap
    from autotune.decision.step import decide
    from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice

    nodes = [
        node_info(f"{m}-{i}", gpu_model=m, gpu_count=4, cpu_milli=32_000, memory_mib=1 << 18)
        for m in ("T4", "A100", "CPU")
        for i in range(2)
    ]
    model = MODEL_CATALOG["gpt-125m"]

    def job(job_id: str, models: tuple[str, ...] | None) -> JobStatus:
        spec = JobSpec(
            job_id=job_id, model=model, global_batch=32, min_gpus=2, max_gpus=2, gpu_types=models
        )
        return JobStatus(spec=spec, state="pending")

    jobs = [job("t4-bf16", ("T4",)), job("t4-fp8", ("T4",)), job("any-bf16", None)]
    jobs += [job("pinned", ("T4",)), job("cpu-bf16", ("CPU",))]
    snapshot = ClusterSnapshot(time_s=0.0, nodes=nodes, jobs=jobs, telemetry="sim")
    bf16, fp8 = PrecisionMap.uniform("bf16"), PrecisionMap.uniform("fp8")
    chosen = {"t4-bf16": bf16, "t4-fp8": fp8, "any-bf16": bf16, "pinned": bf16, "cpu-bf16": bf16}
    choices = {
        job_id: PolicyChoice(
            config=JobConfig(layout=Layout(world_size=2), precision=p), reason="the policy's"
        )
        for job_id, p in chosen.items()
    }
    overrides = {"pinned": _override("pinned", {"precision": {"ffn": "bf16"}})}
    round_ = decide(snapshot, choices, overrides, honoured={}, policy_version="t")
    decided = {d.job_id: d for d in round_.decisions}
    assert set(decided) == set(chosen)
    precision = {job_id: d.config.precision for job_id, d in decided.items() if d.config}
    # A T4 has no bf16 units (emulated at half its fp32) but fp16 units: fp16 instead, as
    # rules would run it there, saying so.
    assert precision["t4-bf16"] == PrecisionMap.uniform("fp16")
    assert "fp16 instead of bf16 for attention_out, attention_qkv, embedding, ffn, head" in (
        decided["t4-bf16"].reason
    )
    assert "slower than fp32 on T4" in decided["t4-bf16"].reason
    # fp8 runs through the T4's fp16 units, faster than its fp32: kept; its bf16 edges in
    # fp16.
    assert precision["t4-fp8"] == PrecisionMap(
        embedding="fp16", attention_qkv="fp8", attention_out="fp8", ffn="fp8", head="fp16"
    )
    # A CPU has neither (its fp32 only): fp32 instead.
    assert precision["cpu-bf16"] == PrecisionMap()
    assert "fp32 instead of bf16" in decided["cpu-bf16"].reason
    assert "slower than fp32 on CPU" in decided["cpu-bf16"].reason
    # A job that may run on an A100 keeps bf16; the user's override is the user's word.
    assert precision["any-bf16"] == bf16
    assert decided["pinned"].source == "override"
    assert precision["pinned"].ffn == "bf16"


def test_a_16_bit_type_is_judged_on_the_gpus_the_job_lands_on() -> None:
    """bf16 chosen for a job that may run on A100s but lands on T4s (no bf16 units)
    trains in fp16 there, saying so; and a job running in fp16 on T4s that the policy
    asks for bf16 keeps running as it is: no restart to run slower (such flip-flops cost
    the daemon's default stream a restart per job every few rounds)."""
    from autotune.catalog.devices import node_info
    from autotune.catalog.profiles import MODEL_CATALOG
    from autotune.core import JobConfig, JobSpec, Layout, Placement, PrecisionMap, RankSlot
    from autotune.decision.step import decide
    from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice

    nodes = [
        node_info(f"{m}-0", gpu_model=m, gpu_count=4, cpu_milli=32_000, memory_mib=1 << 18)
        for m in ("T4", "A100")
    ]
    model = MODEL_CATALOG["gpt-125m"]
    fp16, bf16 = PrecisionMap.uniform("fp16"), PrecisionMap.uniform("bf16")

    def job(job_id: str, node: str | None = None, gpus: tuple[int, ...] = ()) -> JobStatus:
        spec = JobSpec(job_id=job_id, model=model, global_batch=32, min_gpus=1, max_gpus=4)
        if node is None:
            return JobStatus(spec=spec, state="pending")
        ranks = tuple(RankSlot(rank=r, node_id=node, gpu_index=g) for r, g in enumerate(gpus))
        config = JobConfig(layout=Layout(world_size=len(gpus)), precision=fp16)
        placement = Placement(job_id=job_id, ranks=ranks)
        return JobStatus(
            spec=spec, state="running", config=config, placement=placement, progress=0.1
        )

    jobs = [job("on-a100", "A100-0", (0, 1, 2, 3)), job("on-t4", "T4-0", (0, 1)), job("new")]
    snapshot = ClusterSnapshot(time_s=0.0, nodes=nodes, jobs=jobs, telemetry="sim")

    def bf16_for(*job_ids: str) -> dict[str, PolicyChoice]:
        return {
            j: PolicyChoice(
                config=JobConfig(layout=Layout(world_size=2), precision=bf16), reason="policy"
            )
            for j in job_ids
        }

    round_ = decide(snapshot, bf16_for("on-t4", "new"), {}, honoured={}, policy_version="t")
    decided = {d.job_id: d for d in round_.decisions}
    # Only T4s are free: the new job lands there, in fp16.
    assert set(decided) == {"new"}, [d.reason for d in round_.decisions]
    new = decided["new"]
    assert new.placement is not None
    assert {r.node_id for r in new.placement.ranks} == {"T4-0"}
    assert new.config.precision == fp16
    assert "fp16 instead of bf16" in new.reason
    assert "slower than fp32 on the T4 it was placed on" in new.reason
    # The running job's bf16 on its T4s is no change: it keeps its fp16 and its GPUs.
    assert "on-t4" not in decided
    # Where it lands on A100s, the new job keeps bf16.
    free = ClusterSnapshot(time_s=0.0, nodes=nodes[1:], jobs=[job("new")], telemetry="sim")
    (placed,) = decide(free, bf16_for("new"), {}, honoured={}, policy_version="t").decisions
    assert placed.placement is not None
    assert {r.node_id for r in placed.placement.ranks} == {"A100-0"}
    assert placed.config.precision == bf16
