"""The catalog's models as executor tasks: every name the API takes is either a model the
executor builds, with exactly the parameters its profile counts, or simulated only and
refused by a backend that trains for real, saying why. Shrunken configs of the same
classes train a few steps on CPU and their loss goes down. No Ray."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from autotune.api.app import create_app
from autotune.catalog.applications import APPLICATIONS
from autotune.catalog.profiles import MODEL_CATALOG, MODEL_SHAPES, ResNetConfig
from autotune.catalog.tasks import BUILTIN_TASKS, resolve_task, trainable_tasks
from autotune.daemon.auth import TokenCheck, hash_token
from autotune.db import Database
from autotune.executor.errors import ParallelError
from autotune.executor.pipeline import StageModule
from autotune.executor.precision import classify_modules
from autotune.executor.stage_build import build_stage
from autotune.executor.stage_plan import derive_split_points
from autotune.executor.tasks import (
    IGNORE,
    MASK_ID,
    BERTMasked,
    CTRSynthetic,
    GPTBytes,
    ResNetSynthetic,
    TaskError,
    load_task,
)
from autotune.executor.tensor_parallel import derive_tp_plan

TRAINED = ("gpt-125m", "gpt-350m", "gpt-1.3b", "bert-large", "resnet-50", "resnet-152")
SIMULATED = ("gpt-7b", "gpt-13b", "gpt-30b", "gpt-70b", *APPLICATIONS)


def _train(task: Any, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.learning_rate, weight_decay=0.0)
    batches = task.batches(0, 1, seed=0)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = task.loss(model, next(batches))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


# ------------------------------------------------------------------------ the table


def test_every_catalog_name_is_trained_or_simulated_only_with_a_reason() -> None:
    assert set(MODEL_CATALOG) <= set(BUILTIN_TASKS)
    own = {"gpt-char", "mlp-synthetic", "resnet-mini", "ctr-synthetic"}
    assert set(TRAINED) | own == set(trainable_tasks())
    for name in SIMULATED:
        task = BUILTIN_TASKS[name]
        assert task.trainer is None, name
        assert task.simulated_only, name


@pytest.mark.parametrize("name", trainable_tasks())
def test_the_built_model_has_the_parameters_its_profile_counts(name: str) -> None:
    """On the meta device: gpt-1.3b's 1.4 B parameters cost nothing."""
    task = load_task(name)
    with torch.device("meta"):
        model = task.build_model()
    assert sum(p.numel() for p in model.parameters()) == BUILTIN_TASKS[name].profile.parameters


def test_the_resnets_have_torchvisions_parameter_counts() -> None:
    assert MODEL_CATALOG["resnet-50"].parameters == 25_557_032
    assert MODEL_CATALOG["resnet-152"].parameters == 60_192_808
    assert MODEL_CATALOG["resnet-50"].num_layers == 16  # bottleneck blocks
    assert MODEL_CATALOG["resnet-152"].num_layers == 50


def test_catalog_profiles_are_counted_from_the_shapes_the_executor_builds() -> None:
    profile, shape = MODEL_CATALOG["gpt-125m"], MODEL_SHAPES["gpt-125m"]
    assert (profile.hidden_size, profile.num_layers, profile.seq_len) == (768, 12, 1024)
    task = load_task("gpt-125m")
    assert isinstance(task, GPTBytes)
    assert task.config is shape
    assert task.seq_len == profile.seq_len
    assert task.batch_size == profile.reference_batch


@pytest.mark.parametrize("name", SIMULATED)
def test_a_backend_that_trains_refuses_simulated_only_tasks(name: str) -> None:
    assert resolve_task(name, [], trains=False).model is MODEL_CATALOG[name]
    with pytest.raises(ValueError, match=rf"task '{name}' is simulated only: .*gpt-125m"):
        resolve_task(name, [], trains=True)
    with pytest.raises(TaskError, match="is simulated only"):
        load_task(name)


@pytest.mark.parametrize("name", TRAINED)
def test_a_backend_that_trains_accepts_the_trainable_catalog_models(name: str) -> None:
    assert resolve_task(name, [], trains=True).model is MODEL_CATALOG[name]


def test_the_submit_route_refuses_simulated_only_tasks_when_the_backend_trains(
    database: Database,
) -> None:
    token = "model-tasks-token"
    headers = {"Authorization": f"Bearer {token}"}
    check = TokenCheck([hash_token(token)])
    for trains in (True, False):
        app = create_app(db=database, telemetry="ray", token_check=check, trains=trains)
        with TestClient(app) as client:
            body = {"task": "gpt-70b", "job_id": f"big-{trains}", "steps": 10}
            response = client.post("/api/v1/jobs", json=body, headers=headers)
            if trains:
                assert response.status_code == 422, response.text
                assert "simulated only" in response.text
            else:
                assert response.status_code == 201, response.text
            body = {"task": "gpt-125m", "job_id": f"small-{trains}", "steps": 10}
            assert client.post("/api/v1/jobs", json=body, headers=headers).status_code == 201


# ------------------------------------------------------------------------ GPT


def test_a_shrunken_gpt_125m_trains_on_bytes() -> None:
    """GPT-125M's width, heads and vocabulary, 2 blocks, 32 bytes of context."""
    shape = dataclasses.replace(MODEL_SHAPES["gpt-125m"], layers=2, context=32)
    task = GPTBytes(config=shape, batch_size=2)
    inputs, _targets = next(task.batches(0, 1, seed=0))
    assert inputs.shape == (2, 32)
    assert int(inputs.max()) < 256
    losses = _train(task, steps=3)
    assert losses[0] == pytest.approx(torch.log(torch.tensor(50_257.0)).item(), abs=0.5)
    assert losses[-1] < losses[0] - 2.0


def test_gpt_and_bert_blocks_split_for_tensor_parallelism() -> None:
    for name in ("gpt-125m", "bert-large"):
        with torch.device("meta"):
            model = load_task(name).build_model()
        plan = derive_tp_plan(model)
        layers = MODEL_SHAPES[name].layers  # type: ignore[union-attr]
        assert len(plan) == 6 * layers  # q, k, v, out; the feed-forward pair
        assert plan["blocks.0.attn.q_proj"] == "colwise"
        assert plan["blocks.0.attn.out_proj"] == "rowwise"
        assert plan["blocks.0.mlp.fc"] == "colwise"
        assert not any(key.startswith(("lm_head", "head")) for key in plan)


# ------------------------------------------------------------------------ BERT


def _tiny_bert() -> BERTMasked:
    shape = dataclasses.replace(
        MODEL_SHAPES["bert-large"], layers=2, width=64, heads=4, context=48, learning_rate=1e-3
    )
    return BERTMasked(config=shape, batch_size=8)  # type: ignore[arg-type]


def test_masked_lm_batches_mask_some_positions_and_predict_only_those() -> None:
    task = _tiny_bert()
    inputs, targets = next(task.batches(0, 1, seed=3))
    chosen = targets != IGNORE
    assert chosen.any(dim=1).all()  # at least one position per window
    assert 0.05 < chosen.float().mean() < 0.3
    assert (inputs[~chosen] < 256).all()  # unchosen positions are the bytes themselves
    assert (inputs == MASK_ID).sum() > 0.6 * chosen.sum()
    # Every data-parallel degree sees the same global batch.
    parts = [next(task.batches(r, 2, seed=3)) for r in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), inputs)
    assert torch.equal(torch.cat([p[1] for p in parts]), targets)


def test_a_shrunken_bert_trains_as_a_masked_lm() -> None:
    losses = _train(_tiny_bert(), steps=12)
    assert statistics.mean(losses[-3:]) < statistics.mean(losses[:3]) - 1.0


def test_berts_mlm_head_runs_in_the_heads_precision() -> None:
    classes = classify_modules(_tiny_bert().build_model())
    assert classes["head_transform"] == classes["lm_head"] == "head"
    assert classes["blocks.0.attn.q_proj"] == "attention_qkv"
    assert classes["blocks.0.mlp.fc"] == "ffn"


# ------------------------------------------------------------------------ ResNet


def _tiny_resnet(blocks: tuple[int, ...] = (3, 4, 6, 3)) -> ResNetSynthetic:
    """ResNet-50's blocks at width 8, on 32-pixel images of 10 classes."""
    shape = ResNetConfig(blocks=blocks, width=8, classes=10, image=32, learning_rate=3e-3)
    return ResNetSynthetic(config=shape, batch_size=32)


def test_a_shrunken_resnet_50_learns_the_synthetic_teacher() -> None:
    losses = _train(_tiny_resnet(), steps=40)
    assert statistics.mean(losses[-10:]) < statistics.mean(losses[:10]) - 0.15


def test_resnet_mini_is_the_catalogs_shape_and_learns() -> None:
    """``resnet-mini`` loads with its catalog shape (one block per stage, 32-pixel
    images), counts 0.51 M parameters and learns its teacher in a short run."""
    task = load_task("resnet-mini")
    assert isinstance(task, ResNetSynthetic)
    assert task.config is BUILTIN_TASKS["resnet-mini"].shape
    profile = BUILTIN_TASKS["resnet-mini"].profile
    assert (profile.parameters, profile.num_layers, profile.reference_batch) == (511_514, 4, 64)
    images, _ = next(task.batches(0, 1, seed=0))
    assert images.shape == (64, 3, 32, 32)
    losses = _train(task, steps=60)
    assert statistics.mean(losses[-10:]) < statistics.mean(losses[:10]) - 0.1


def test_ctr_synthetic_is_embedding_rows_that_a_step_barely_touches() -> None:
    """DLRM's shape: nearly every parameter an embedding row, a step's gradient on a few
    of them; the loss falls from chance (ln 2); every data-parallel degree sees the same
    impressions; neither tensor nor pipeline parallel, saying why."""
    task = load_task("ctr-synthetic")
    assert isinstance(task, CTRSynthetic)
    profile = BUILTIN_TASKS["ctr-synthetic"].profile
    assert profile.parameters == 532_609
    torch.manual_seed(0)
    model = task.build_model()
    embed = dict(model.named_modules())["embed"]
    assert embed.weight.numel() / profile.parameters > 0.98
    assert classify_modules(model) == {"embed": "embedding", "up": "ffn", "head": "head"}
    losses = _train(task, steps=150)
    assert statistics.mean(losses[:10]) == pytest.approx(0.693, abs=0.02)
    assert statistics.mean(losses[-10:]) < 0.58
    model.zero_grad()
    task.loss(model, next(task.batches(0, 1, seed=3))).backward()
    touched = int((embed.weight.grad.abs().sum(1) > 0).sum())
    assert touched < 0.1 * embed.weight.shape[0]  # the Zipf law's popular rows
    whole = next(task.batches(0, 1, seed=5))
    parts = [next(task.batches(r, 4, seed=5)) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
    assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])
    assert 0.2 < float(whole[1].mean()) < 0.8
    with pytest.raises(ParallelError, match="embedding table"):
        task.tp_plan()
    with pytest.raises(ParallelError, match="cannot find a stack of blocks"):
        derive_split_points(model, 2)


def test_synthetic_images_are_the_same_for_every_data_parallel_degree() -> None:
    task = _tiny_resnet()
    images, labels = next(task.batches(0, 1, seed=5))
    assert images.shape == (32, 3, 32, 32)
    assert labels.shape == (32,)
    parts = [next(task.batches(r, 3, seed=5)) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), images)
    assert torch.equal(torch.cat([p[1] for p in parts]), labels)
    assert len(set(labels.tolist())) > 3


def test_resnet_refuses_tensor_parallelism_saying_why() -> None:
    task = _tiny_resnet()
    assert derive_tp_plan(task.build_model()) == {}
    with pytest.raises(ParallelError, match=r"convolutions.*data or pipeline parallelism"):
        task.tp_plan()


@pytest.mark.parametrize("make", [_tiny_resnet, _tiny_bert], ids=["resnet", "bert"])
def test_pipeline_stages_compute_the_whole_model(make: Any) -> None:
    """Two stages, each holding its own parameters only (``build_stage``), cut at the
    middle block, give the whole model's output: for the ResNet, blocks of different
    widths and resolutions on either side of the cut."""
    task = make()
    inputs, _ = next(task.batches(0, 1, seed=0))
    torch.manual_seed(0)
    whole = task.build_model().eval()
    outputs = []
    for stage in range(2):
        built = build_stage(
            task.build_model,
            seed=0,
            stages=2,
            stage=stage,
            split_points=lambda m: derive_split_points(m, 2),
            example=inputs,
        )
        model = built.model.eval()
        assert built.plan.parent == "blocks"
        blocks = model.blocks
        assert isinstance(blocks, torch.nn.ModuleList)
        outputs.append(StageModule(model, blocks, built.plan.ranges[stage], last=stage == 1))
    first, last = outputs
    last.template = inputs
    with torch.no_grad():
        middle = first(inputs)
        torch.testing.assert_close(last(middle), whole(inputs))
    if make is _tiny_resnet:
        assert derive_split_points(whole, 2) == ["blocks.8"]
        assert middle.shape[1] == 4 * 8 * 4  # the third stage's channels


def test_a_resnets_convolutions_follow_the_ffn_precision() -> None:
    model = _tiny_resnet((1, 1, 1, 1)).build_model()
    classes = classify_modules(model)
    convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs
    assert {classes[n] for n in convs} == {"ffn"}
