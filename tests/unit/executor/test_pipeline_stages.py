"""Pipeline stages that hold their own parameters only: which stage owns what, the
values a stage starts from (the whole model's, a checkpoint's, a seeded per-module
initialisation), tied weights refused, and (in local processes over gloo, no Ray)
training and checkpoints across pp 1, 2 and 4."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import REPO
from torch import nn

from autotune.core import JobConfig, Layout, PrecisionMap
from autotune.executor.errors import ParallelError
from autotune.executor.local import run_local
from autotune.executor.pipeline import StageModule
from autotune.executor.precision import PrecisionController, classify_modules
from autotune.executor.stage_build import build_stage, parameter_bytes
from autotune.executor.stage_plan import derive_split_points, find_blocks
from autotune.executor.tasks import TrainingTask, load_task
from autotune.executor.worker import WorkerSpec

TASKS = REPO / "tests" / "data" / "pipeline_tasks.py"


def task(name: str) -> TrainingTask:
    return load_task(f"{TASKS}:{name}")


def stages_of(t: TrainingTask, pp: int, **kwargs: object) -> list:
    inputs, _ = next(t.batches(0, 1, seed=0))
    return [
        build_stage(
            t.build_model,
            seed=7,
            stages=pp,
            stage=s,
            split_points=lambda m: derive_split_points(m, pp),
            example=inputs,
            **kwargs,  # type: ignore[arg-type]
        )
        for s in range(pp)
    ]


def full_model(t: TrainingTask, seed: int = 7) -> nn.Module:
    torch.manual_seed(seed)
    return t.build_model()


# ----------------------------------------------------------------------------- ownership


@pytest.mark.parametrize("pp", [2, 4])
def test_a_stage_holds_its_blocks_and_the_layers_around_them_only(pp: int) -> None:
    t = task("GPT8")
    full = full_model(t)
    reference = dict(full.named_parameters())
    stages = stages_of(t, pp)
    held: dict[str, int] = {}
    for s, built in enumerate(stages):
        span = built.plan.ranges[s]
        for name, p in built.model.named_parameters():
            if p.is_meta:
                continue
            held[name] = s
            # initialised exactly as the whole model, from the same seed
            assert torch.equal(p, reference[name]), name
        blocks = {int(n.split(".")[1]) for n in held if n.startswith("blocks.") and held[n] == s}
        assert blocks == set(span)
    assert set(held) == set(reference)  # every parameter held once, by one stage
    assert {held["wte.weight"], held["wpe.weight"]} == {0}
    assert {held["ln_f.weight"], held["lm_head.weight"]} == {pp - 1}
    total = parameter_bytes(full)
    assert sum(parameter_bytes(b.model) for b in stages) == total
    assert all(b.model_bytes == total for b in stages)
    # the other stages' tensors have no storage
    for built in stages:
        assert any(p.is_meta for p in built.model.parameters())


def test_stages_compose_to_the_whole_model_and_keep_the_module_names() -> None:
    t = task("GPT8")
    full = full_model(t)
    inputs, _ = next(t.batches(0, 1, seed=0))
    expected = full(inputs)
    stages = stages_of(t, 4)
    x = inputs
    for s, built in enumerate(stages):
        # the precision classes see the whole model's names and module types
        assert classify_modules(built.model) == classify_modules(full)
        blocks = built.model.blocks
        module = StageModule(built.model, blocks, built.plan.ranges[s], last=s == 3)
        module.template = inputs
        x = module(x)
    assert torch.equal(x, expected)


def test_a_later_stage_runs_under_a_reduced_precision_map() -> None:
    """The layers before a later stage's blocks run on meta, where the precision
    wrappers' NaN checks have nothing to read: the worker turns them off there."""
    t = task("GPT8")
    inputs, _ = next(t.batches(0, 1, seed=0))
    first, last = stages_of(t, 2)
    controllers = [
        PrecisionController(b.model, PrecisionMap.uniform("bf16")) for b in (first, last)
    ]

    def quiet() -> object:
        from contextlib import contextmanager

        @contextmanager
        def ctx():  # type: ignore[no-untyped-def]
            controllers[1].precision = PrecisionMap.uniform("fp32")
            controllers[1].watching = False
            try:
                yield
            finally:
                controllers[1].precision = PrecisionMap.uniform("bf16")
                controllers[1].watching = True

        return ctx()

    a = StageModule(first.model, first.model.blocks, first.plan.ranges[0], last=False)
    b = StageModule(
        last.model, last.model.blocks, last.plan.ranges[1], last=True, prefix_context=quiet
    )
    b.template = inputs
    out = b(a(inputs))
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all()
    assert not controllers[1].nonfinite


def test_weights_tied_across_stages_are_refused_naming_them() -> None:
    with pytest.raises(ParallelError, match=r"'wte\.weight' \(tied to 'lm_head\.weight'\)"):
        stages_of(task("TiedGPT"), 2)
    with pytest.raises(ParallelError, match=r"'inner\.wte\.weight' is used by pipeline stages"):
        stages_of(task("ReusingGPT"), 2)


def test_tied_weights_within_one_stage_stay_tied() -> None:
    class TiedInBlocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
            self.blocks[1].weight = self.blocks[0].weight  # both in stage 0
            self.head = nn.Linear(8, 16)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    idx = torch.randint(0, 16, (2, 3))
    first = build_stage(
        TiedInBlocks,
        seed=0,
        stages=2,
        stage=0,
        split_points=lambda m: ["blocks.2"],
        example=idx,
    )
    assert first.model.blocks[0].weight is first.model.blocks[1].weight
    assert not first.model.blocks[0].weight.is_meta
    assert first.plan.canonical["blocks.1.weight"] == "blocks.0.weight"


def test_buffers_go_with_their_stage_and_are_the_whole_models() -> None:
    t = task("BufferTask")
    full = full_model(t)
    reference = dict(full.named_buffers())
    stages = stages_of(t, 2)
    for s, built in enumerate(stages):
        held = {n for n, b in built.model.named_buffers() if not b.is_meta}
        assert held == built.plan.buffers(s)
        for name in held:  # the random offset too: drawn as the whole model draws it
            assert torch.equal(dict(built.model.named_buffers())[name], reference[name]), name
    assert "offset" in stages[0].plan.buffers(0)
    assert "blocks.3.mask" in stages[1].plan.buffers(1)
    assert "blocks.3.mask" not in stages[0].plan.buffers(0)


def test_a_stage_restores_from_checkpoint_tensors_without_building_the_model() -> None:
    t = task("BufferTask")
    full = full_model(t, seed=3)
    values = {**dict(full.named_parameters()), **dict(full.named_buffers())}
    values = {n: v.detach() + 1.0 for n, v in values.items()}  # not what the seed gives
    for s, built in enumerate(stages_of(t, 2, values=values)):
        assert set(built.sources) == {"checkpoint"}
        for name, p in built.model.named_parameters():
            if not p.is_meta:
                assert torch.equal(p, values[name])
        assert s in built.plan.buffer_stages["blocks.0.scale"] or s == 1


def test_above_the_full_build_limit_each_module_is_initialised_alone() -> None:
    """No rank builds the whole model; the values do not depend on the layout."""
    t = task("GPT8")
    whole = stages_of(t, 1, full_init_max_bytes=0)[0]
    assert whole.sources == {"module reset": 133}
    merged: dict[str, torch.Tensor] = {}
    for built in stages_of(t, 4, full_init_max_bytes=0):
        assert set(built.sources) == {"module reset"}
        merged.update({n: p for n, p in built.model.named_parameters() if not p.is_meta})
    for name, p in whole.model.named_parameters():
        assert torch.equal(merged[name], p), name
    # not all zeros or ones: really initialised
    assert merged["blocks.5.mlp.fc.weight"].std() > 0


# ----------------------------------------------------------------------------- training


def spec(name: str, pp: int = 1, dp: int = 1, tp: int = 1, **kwargs: object) -> WorkerSpec:
    micro = 2 if pp > 1 else 1
    return WorkerSpec(
        task=f"{TASKS}:{name}",
        config=JobConfig(
            layout=Layout(world_size=dp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batches=micro),
            **kwargs,  # type: ignore[arg-type]
        ),
        seed=5,
    )


@pytest.mark.slow
def test_pp_1_2_4_train_alike_and_restore_each_others_checkpoints() -> None:
    """One seed: pp=2 trains as pp=1 does, each rank holding its stage only; a pp=2
    checkpoint continues in pp=4 and pp=1, and a pp=1 one in pp=2, as the uninterrupted
    run does (stages start from the whole model's weights: see the tests above)."""
    one = run_local(spec("GPT8"), 5, save=False).losses()
    two = run_local(spec("GPT8", pp=2), 2)
    assert two.losses() == pytest.approx(one[:2], rel=1e-5)
    whole = two.memory[0]["model_parameter_bytes"]
    assert sum(m["parameter_bytes"] for m in two.memory) == whole
    assert max(m["parameter_bytes"] for m in two.memory) <= 0.6 * whole
    assert two.state is not None
    names = set(dict(task("GPT8").build_model().named_parameters()))
    assert two.state["model"].keys() == two.state["optim"].keys() == names
    four = run_local(spec("GPT8", pp=4), 2, state=two.state, save=False)
    assert four.losses() == pytest.approx(one[2:4], rel=1e-4)
    assert max(m["parameter_bytes"] for m in four.memory) <= 0.35 * whole
    single = run_local(spec("GPT8"), 2, state=two.state)
    assert single.losses() == pytest.approx(one[2:4], rel=1e-4)
    assert single.state is not None
    assert single.state["step"] == 4
    again = run_local(spec("GPT8", pp=2), 1, state=single.state, save=False)
    assert again.losses() == pytest.approx(one[4:], rel=1e-4)


def test_stage_weights_cut_the_block_stack_in_their_proportions() -> None:
    model = task("GPT8").build_model()
    name, blocks = find_blocks(model)
    assert len(blocks) == 8
    assert derive_split_points(model, 2, (1.0, 1.0)) == derive_split_points(model, 2)
    assert derive_split_points(model, 2, (3.0, 1.0)) == [f"{name}.6"]
    assert derive_split_points(model, 3, (2.0, 1.0, 1.0)) == [f"{name}.4", f"{name}.6"]
    assert derive_split_points(model, 2, (100.0, 1.0)) == [f"{name}.7"]  # a block each
    with pytest.raises(ParallelError, match="2 pipeline stages need 2 weights"):
        derive_split_points(model, 2, (1.0, 1.0, 1.0))
    with pytest.raises(ParallelError, match="1 stage weights for 2 pipeline stages"):
        replace(spec("GPT8", pp=2), stage_weights=(1.0,))


def test_stages_cut_by_weights_train_as_one_rank_does() -> None:
    """pp=2 with stage 0 holding 6 of the 8 blocks (3:1): the same losses as pp=1, and
    stage 0 holds about three times stage 1's block parameters."""
    one = run_local(spec("GPT8"), 2, save=False).losses()
    weighted = run_local(replace(spec("GPT8", pp=2), stage_weights=(3.0, 1.0)), 2, save=False)
    assert weighted.losses() == pytest.approx(one, rel=1e-5)
    first, second = (m["parameter_bytes"] for m in weighted.memory)
    assert first > 2 * second


@pytest.mark.slow
def test_tensor_and_pipeline_parallel_with_buffers_and_bf16() -> None:
    """tp=2 x pp=2 on a model with buffers, bf16 everywhere: trains like one rank (the
    later stage's meta prefix under a reduced precision map included); the checkpoint
    has every parameter, unsharded, and the buffers."""
    bf16 = PrecisionMap.uniform("bf16")
    one = run_local(spec("BufferTask", precision=bf16), 2, save=False)
    both = run_local(spec("BufferTask", pp=2, tp=2, precision=bf16), 2)
    assert both.losses() == pytest.approx(one.losses(), rel=2e-2)
    assert not [e for e in both.events() if e["kind"] == "nonfinite"]
    assert {s["tp_plan"] != {} for s in both.setup} == {True}
    assert both.state is not None
    names = set(dict(task("BufferTask").build_model().named_parameters()))
    assert both.state["model"].keys() == names
    assert {"offset", "blocks.0.scale", "blocks.3.mask"} <= set(both.state["buffers"])
