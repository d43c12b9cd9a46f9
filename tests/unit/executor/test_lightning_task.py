"""A ``LightningModule`` as a task (``autotune.executor.lightning``): its
``train_dataloader``, ``training_step`` and ``configure_optimizers`` become the batches,
the loss and the optimizer, what cannot be mapped is refused saying why, and it trains
under data (top-k compressed), tensor and pipeline parallelism and in bf16."""

from __future__ import annotations

import itertools
import re
import sys
import warnings
from dataclasses import replace
from typing import Any

import pytest
import torch
from helpers import REPO

from autotune.catalog.tasks import resolve_task
from autotune.core import CompressionSpec, JobConfig, Layout, PrecisionMap
from autotune.executor.lightning import LightningTask
from autotune.executor.local import run_local, single_rank
from autotune.executor.pipeline import replay
from autotune.executor.tasks import TaskError, load_task
from autotune.executor.worker import WorkerSpec

FILE = REPO / "tests" / "data" / "lightning_tasks.py"


def name(cls: str) -> str:
    return f"lightning:{FILE}:{cls}"


TASK = name("TeacherMLP")


def task(cls: str = "TeacherMLP", **kwargs: Any) -> LightningTask:
    loaded = load_task(name(cls), **kwargs)
    assert isinstance(loaded, LightningTask)
    return loaded


def data() -> Any:
    """The test module, as the task imported it (its constants)."""
    return sys.modules[task().module_class.__module__]


# --------------------------------------------------------------------------------------
# The mapping
# --------------------------------------------------------------------------------------


def test_the_global_batch_is_the_dataloaders_and_each_rank_takes_its_slice() -> None:
    t = task()
    assert t.batch_size == data().BATCH
    whole = list(itertools.islice(t.batches(0, 1, seed=5), 20))  # past an epoch of 16
    parts = [list(itertools.islice(t.batches(r, 2, seed=5), 20)) for r in range(2)]
    for step, (x, y) in enumerate(whole):
        assert x.shape == (data().BATCH, data().FEATURES)
        assert torch.equal(torch.cat([parts[0][step][0], parts[1][step][0]]), x)
        assert torch.equal(torch.cat([parts[0][step][1], parts[1][step][1]]), y)
    assert not torch.equal(whole[0][0], whole[16][0])  # the second epoch reshuffles
    other_seed = next(iter(t.batches(0, 1, seed=6)))
    assert not torch.equal(other_seed[0], whole[0][0])


def test_the_jobs_batch_size_rebatches_the_dataloaders_samples() -> None:
    t = task(batch_size=48)
    assert t.batch_size == 48
    rebatched = torch.cat([x for x, _ in itertools.islice(t.batches(0, 1, seed=5), 4)])
    plain = torch.cat([x for x, _ in itertools.islice(task().batches(0, 1, seed=5), 6)])
    assert torch.equal(rebatched, plain)  # the same samples in the same order


def test_the_loss_is_training_steps_plain_or_in_lightnings_dict() -> None:
    for cls in ("TeacherMLP", "DictLoss"):
        t = task(cls)
        model = t.build_model()
        batch = next(iter(t.batches(0, 1, seed=0)))
        x, y = batch
        expected = torch.nn.functional.cross_entropy(model(x), y)
        with torch.no_grad():
            assert float(t.loss(model, batch)) == pytest.approx(float(expected))


def test_the_optimizer_is_configure_optimizers_over_the_ranks_own_parameters() -> None:
    t = task()
    model = t.build_model()
    own = [(n, p) for n, p in model.named_parameters() if n.startswith("blocks.")]
    optimizer = t.optimizer(model, own)
    assert type(optimizer) is torch.optim.AdamW
    (group,) = optimizer.param_groups
    assert group["lr"] == data().LEARNING_RATE
    assert group["weight_decay"] == data().WEIGHT_DECAY
    assert [id(p) for p in group["params"]] == [id(p) for _, p in own]

    t = task("DictLoss")
    model = t.build_model()
    sgd = t.optimizer(model, list(model.named_parameters()))
    assert type(sgd) is torch.optim.SGD
    assert (sgd.defaults["lr"], sgd.defaults["momentum"]) == (0.05, 0.9)

    t = task("TwoGroups")
    model = t.build_model()
    groups = t.optimizer(model, list(model.named_parameters())).param_groups
    assert [g["lr"] for g in groups] == [data().LEARNING_RATE, data().LEARNING_RATE / 10]
    heads = t.optimizer(model, [("head.weight", model.head.weight)]).param_groups
    assert [g["lr"] for g in heads] == [data().LEARNING_RATE / 10]


def test_the_pipelines_last_stage_runs_training_step_on_the_stages_output() -> None:
    t = task()
    model = t.build_model()
    x, y = next(iter(t.batches(0, 1, seed=0)))
    with torch.no_grad():
        output = model(x)
        assert float(t.loss(replay(output), (None, y))) == pytest.approx(
            float(t.loss(model, (x, y)))
        )
        twice = task("TwiceForward")
        with pytest.raises(TaskError, match=r"called self\(...\) 2 times; pipeline"):
            twice.loss(replay(output), (None, y))


def test_the_jobs_learning_rate_replaces_configure_optimizers() -> None:
    threads = torch.get_num_threads()
    spec = WorkerSpec(task=TASK, config=JobConfig(layout=Layout(world_size=1, dp=1)))
    try:
        with single_rank(replace(spec, learning_rate=1e-2)) as worker:
            optimizer = worker.optimizer
            assert type(optimizer) is torch.optim.AdamW
            assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [
                (1e-2, data().WEIGHT_DECAY)
            ]
    finally:
        torch.set_num_threads(threads)


def test_without_lightning_the_task_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.catalog.tasks._LIGHTNING_PACKAGES", ("no_such_package",))
    hint = r"needs Lightning: pip install 'autotune\[lightning\]'"
    with pytest.raises(TaskError, match=hint):
        load_task(TASK)
    with pytest.raises(ValueError, match=hint):
        resolve_task("lightning:mypkg.models:Net", ["mypkg"])


def test_a_module_on_the_path_is_named_by_its_module() -> None:
    """``tests`` is on the test path: ``data.lightning_tasks`` is the test module."""
    assert isinstance(load_task("lightning:data.lightning_tasks:TeacherMLP"), LightningTask)
    assert resolve_task("lightning:data.lightning_tasks:TeacherMLP", ["data"]).model is None


def test_self_log_without_a_trainer_neither_fails_nor_warns() -> None:
    t = task()
    model = t.build_model()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.loss(model, next(iter(t.batches(0, 1, seed=0))))
    assert [str(w.message) for w in caught] == []


# --------------------------------------------------------------------------------------
# Refusals, each with its reason
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "reason"),
    [
        ("Plain", "is not a LightningModule"),
        ("NoData", "does not implement configure_optimizers, train_dataloader"),
        ("StepsItself", "overrides optimizer_step (it changes the optimizer step)"),
        ("Arguments", "needs width: the executor constructs the module with no arguments"),
        ("Missing", "has no attribute 'Missing'"),
    ],
)
def test_what_cannot_be_a_task_is_refused_when_loading(cls: str, reason: str) -> None:
    with pytest.raises(TaskError, match=re.escape(reason)):
        load_task(name(cls))


def test_manual_optimization_is_refused() -> None:
    with pytest.raises(TaskError, match=r"manual optimization .* steps the optimizer itself"):
        task("Manual").build_model()


@pytest.mark.parametrize(
    ("cls", "reason"),
    [
        ("TwoOptimizers", "gives 2 optimizers: the executor steps one"),
        ("WithScheduler", r"scheduler \(StepLR\): the executor cannot rebuild it"),
    ],
)
def test_optimizers_it_cannot_map_are_refused(cls: str, reason: str) -> None:
    t = task(cls)
    model = t.build_model()
    with pytest.raises(TaskError, match=reason):
        t.optimizer(model, list(model.named_parameters()))


@pytest.mark.parametrize(
    ("cls", "reason"),
    [
        ("FloatLoss", "training_step returned float: it must return the loss"),
        ("NoLoss", "training_step returned a dict whose 'loss' is NoneType"),
        ("NeedsTrainer", "training_step uses self.trainer"),
    ],
)
def test_a_training_step_it_cannot_map_is_refused(cls: str, reason: str) -> None:
    t = task(cls)
    model = t.build_model()
    with pytest.raises(TaskError, match=reason):
        t.loss(model, next(iter(t.batches(0, 1, seed=0))))


def test_the_api_takes_allow_listed_lightning_modules_only() -> None:
    assert resolve_task("lightning:mypkg.models:Net", ["mypkg"]).model is None
    with pytest.raises(ValueError, match="not on the allow-list"):
        resolve_task("lightning:other.models:Net", ["mypkg"])
    with pytest.raises(ValueError, match=r"expected lightning:package\.module:ClassName"):
        resolve_task(f"lightning:{FILE}:TeacherMLP", ["mypkg"])


# --------------------------------------------------------------------------------------
# Training 20 steps in each layout
# --------------------------------------------------------------------------------------

STEPS = 20
BF16 = PrecisionMap(embedding="bf16", attention_qkv="bf16", attention_out="bf16", ffn="bf16")
LAYOUTS = {
    "dp2-topk": Layout(world_size=2, dp=2),
    "dp2": Layout(world_size=2, dp=2),  # DistributedDataParallel's path
    "tp2": Layout(world_size=2, dp=1, tp=2),
    "pp2": Layout(world_size=2, dp=1, pp=2, micro_batches=2),
}


def _decreases(losses: list[float]) -> None:
    assert len(losses) == STEPS
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.7 * first, losses


def _one_rank(config: JobConfig) -> list[float]:
    """``STEPS`` steps of one rank in this process."""
    threads = torch.get_num_threads()
    try:
        with single_rank(WorkerSpec(task=TASK, config=config, seed=0)) as worker:
            losses = [worker.step().loss for _ in range(STEPS)]
            assert worker.precision.precision == config.precision
    finally:
        torch.set_num_threads(threads)
    assert all(loss is not None for loss in losses)
    return [float(loss) for loss in losses if loss is not None]


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """The losses of one rank in fp32."""
    return _one_rank(JobConfig(layout=Layout(world_size=1, dp=1)))


def test_a_lightning_module_trains_in_bf16(reference: list[float]) -> None:
    losses = _one_rank(JobConfig(layout=Layout(world_size=1, dp=1), precision=BF16))
    _decreases(losses)
    _decreases(reference)
    assert losses != reference


@pytest.mark.slow
@pytest.mark.parametrize("label", list(LAYOUTS))
def test_a_lightning_module_trains_in_every_layout(label: str, reference: list[float]) -> None:
    compression = CompressionSpec(kind="topk", ratio=0.1) if label == "dp2-topk" else None
    config = JobConfig(layout=LAYOUTS[label], compression=compression or CompressionSpec())
    run = run_local(WorkerSpec(task=TASK, config=config, seed=0), STEPS, save=False)
    losses = run.losses()
    _decreases(losses)
    if compression is None:  # the same global batches and updates as one rank
        assert losses == pytest.approx(reference, rel=2e-3)
    if label == "tp2":
        assert run.setup[0]["tp_plan"] == {
            f"blocks.{i}.{layer}": style
            for i in range(4)
            for layer, style in (("up", "colwise"), ("down", "rowwise"))
        }
    if label == "pp2":
        assert [s["stage_blocks"] for s in run.setup] == [[0, 1], [2, 3]]
