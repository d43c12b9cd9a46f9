"""Executor parts that need neither Ray nor a process group: tasks, splitting rules,
precision classes, option parsing, and the ``job run`` command's errors."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import torch
from helpers import REPO, autotune_command, cli
from torch import nn

from autotune.cli.common import parse_compression
from autotune.cli.executor import parse_precision
from autotune.core import CompressionSpec, PrecisionMap
from autotune.errors import InputError
from autotune.executor.errors import ParallelError
from autotune.executor.pipeline import StageModule
from autotune.executor.precision import LossScaler, PrecisionController, classify_modules
from autotune.executor.stage_plan import derive_split_points, stage_ranges
from autotune.executor.tasks import GPTChar, MLPSynthetic, TaskError, load_task
from autotune.executor.tensor_parallel import derive_tp_plan
from autotune.executor.worker import _all_finite

# ----------------------------------------------------------------------------- tasks


def test_builtin_tasks_load_and_compute_a_loss() -> None:
    for name in ("gpt-char", "mlp-synthetic"):
        task = load_task(name, batch_size=8)
        model = task.build_model()
        batch = next(task.batches(0, 1, seed=0))
        loss = task.loss(model, batch)
        assert loss.ndim == 0
        assert torch.isfinite(loss)


def test_data_parallel_shards_partition_the_global_batch() -> None:
    task = GPTChar(batch_size=8)
    whole = next(task.batches(0, 1, seed=3))
    halves = [next(task.batches(r, 2, seed=3)) for r in range(2)]
    for i in range(2):
        assert torch.equal(torch.cat([h[i] for h in halves]), whole[i])
    # targets are the inputs shifted by one byte
    assert torch.equal(whole[0][:, 1:], whole[1][:, :-1])


def test_gpt_char_reads_real_text() -> None:
    inputs, _ = next(GPTChar(batch_size=4).batches(0, 1, seed=0))
    text = bytes(inputs[0].tolist()).decode("utf-8", errors="replace")
    assert text.isprintable() or "\n" in text


def test_user_task_from_file(tmp_path) -> None:
    path = tmp_path / "mytask.py"
    path.write_text(
        textwrap.dedent(
            """
            from autotune.executor.tasks import MLPSynthetic

            class Wide(MLPSynthetic):
                def __init__(self):
                    super().__init__(hidden=32)
            """
        )
    )
    task = load_task(f"{path}:Wide", batch_size=4)
    assert isinstance(task, MLPSynthetic)
    assert task.hidden == 32
    assert task.batch_size == 4


def test_user_task_from_module() -> None:
    task = load_task("autotune.executor.tasks:MLPSynthetic")
    assert isinstance(task, MLPSynthetic)


@pytest.mark.parametrize(
    ("source", "spec", "message"),
    [
        (None, "nope", "expected a built-in name"),
        (None, "missing_file.py:X", "no such file"),
        ("raise RuntimeError('boom')\n", "{path}:X", "importing"),
        ("x = 1\n", "{path}:Task", "has no attribute 'Task'"),
        ("class Task:\n    def build_model(self): pass\n", "{path}:Task", "lacks batches, loss"),
        (
            "class Task:\n    def __init__(self): raise ValueError('bad')\n",
            "{path}:Task",
            "constructing it failed",
        ),
        (None, "no.such.module:Task", "importing no.such.module failed"),
    ],
)
def test_bad_tasks_are_named_in_the_error(tmp_path, source, spec, message) -> None:
    path = tmp_path / "bad.py"
    if source is not None:
        path.write_text(source)
    spec = spec.format(path=path)
    with pytest.raises(TaskError, match=message) as info:
        load_task(spec)
    assert spec.split(":")[0] in str(info.value) or "nope" in str(info.value)


def test_batches_split_unevenly_when_they_must() -> None:
    task = MLPSynthetic(batch_size=10)
    parts = [next(task.batches(r, 3, seed=0))[0] for r in range(3)]
    assert [len(p) for p in parts] == [4, 3, 3]
    assert torch.equal(torch.cat(parts), next(task.batches(0, 1, seed=0))[0])
    with pytest.raises(TaskError, match="smaller than the data-parallel degree"):
        next(MLPSynthetic(batch_size=2).batches(0, 3, seed=0))


# ----------------------------------------------------------------------------- splitting


def test_tp_plan_for_gpt_shards_attention_and_mlp() -> None:
    plan = derive_tp_plan(GPTChar().build_model())
    assert plan["blocks.0.attn.q_proj"] == "colwise"
    assert plan["blocks.0.attn.v_proj"] == "colwise"
    assert plan["blocks.0.attn.out_proj"] == "rowwise"
    assert plan["blocks.3.mlp.fc"] == "colwise"
    assert plan["blocks.3.mlp.proj"] == "rowwise"
    assert "lm_head" not in plan
    assert "wte" not in plan


def test_tp_plan_for_torch_transformer_encoder_shards_the_feed_forward() -> None:
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False))
    plan = derive_tp_plan(model)
    assert plan == {
        f"0.layers.{i}.{name}": style
        for i in range(3)
        for name, style in (("linear1", "colwise"), ("linear2", "rowwise"))
    }
    assert derive_split_points(model, 3) == ["0.layers.1", "0.layers.2"]


def test_models_without_a_pattern_are_refused_with_a_reason() -> None:
    from autotune.executor.tensor_parallel import apply_tensor_parallel

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 8)

    with pytest.raises(ParallelError, match="tp_plan"):
        apply_tensor_parallel(Flat(), mesh=None, plan=None)
    with pytest.raises(ParallelError, match="split_points"):
        derive_split_points(Flat(), 2)
    with pytest.raises(ParallelError, match="cannot split 4 blocks"):
        derive_split_points(GPTChar().build_model(), 5)


def test_split_points_are_checked() -> None:
    model = GPTChar().build_model()
    assert stage_ranges(model, ["blocks.1", "blocks.3"], 3)[1] == [
        range(0, 1),
        range(1, 3),
        range(3, 4),
    ]
    for bad, why in (
        (["blocks.3", "blocks.1"], "increasing"),
        (["blocks"], "not '<module list>.<index>'"),
        (["ln_f.1"], "not an nn.ModuleList"),
    ):
        with pytest.raises(ParallelError, match=why):
            stage_ranges(model, bad, len(bad) + 1)


def test_pipeline_stages_compose_to_the_whole_model() -> None:
    """Stage 0's output fed to stage 1 gives the full model's output."""
    import copy

    torch.manual_seed(0)
    model = GPTChar().build_model()
    inputs, _ = next(GPTChar(batch_size=2).batches(0, 1, seed=0))
    expected = model(inputs)
    _, ranges = stage_ranges(model, ["blocks.2"], 2)
    first_model, last_model = copy.deepcopy(model), copy.deepcopy(model)
    first = StageModule(first_model, first_model.blocks, ranges[0], last=False)
    last = StageModule(last_model, last_model.blocks, ranges[1], last=True)
    hidden = first(inputs)
    assert hidden.shape == (2, 64, 128)
    last.template = inputs
    torch.testing.assert_close(last(hidden), expected)


# ----------------------------------------------------------------------------- precision


def test_module_classes_of_gpt() -> None:
    classes = classify_modules(GPTChar().build_model())
    assert classes["wte"] == "embedding"
    assert classes["blocks.0.attn.k_proj"] == "attention_qkv"
    assert classes["blocks.0.attn.out_proj"] == "attention_out"
    assert classes["blocks.0.mlp.fc"] == classes["blocks.0.mlp.proj"] == "ffn"
    assert classes["blocks.0.ln_1"] == classes["ln_f"] == "norm"
    assert classes["lm_head"] == "head"


def test_precision_map_changes_the_computation_dtype() -> None:
    torch.manual_seed(0)
    task = GPTChar(batch_size=2)
    model = task.build_model()
    batch = next(task.batches(0, 1, seed=0))
    reference = model(batch[0])
    PrecisionController(model, PrecisionMap.uniform("bf16"))
    low = model(batch[0])
    assert low.dtype == torch.bfloat16
    assert not torch.equal(low.float(), reference)
    torch.testing.assert_close(low.float(), reference, atol=0.1, rtol=0.05)
    loss = task.loss(model, batch)
    loss.backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())


def test_fp8_rounds_inputs_and_weights_through_e4m3() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(128, 64, bias=False)
    model = nn.Sequential(linear, nn.Identity())
    x = torch.randn(4, 128)
    PrecisionController(model, PrecisionMap(head="fp8"))
    out = model(x)
    from autotune.kernels import dequantize_blockwise, quantize_blockwise

    def rounded(t: torch.Tensor) -> torch.Tensor:
        q, s, _ = quantize_blockwise(t.contiguous(), 128, "fp8_e4m3")
        return dequantize_blockwise(q, s, 128, torch.float32).bfloat16()

    expected = rounded(x) @ rounded(linear.weight.detach()).T
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)
    out.float().sum().backward()
    assert linear.weight.grad is not None
    assert linear.weight.grad.dtype == torch.float32


def test_nonfinite_outputs_move_the_class_one_step_safer() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    controller = PrecisionController(model, PrecisionMap(ffn="fp16"))
    model(torch.full((1, 4), 1e6))
    assert controller.nonfinite == {"ffn"}  # not the head, which only received the Inf
    assert controller.fall_back({"ffn"}) == [{"module_class": "ffn", "from": "fp16", "to": "bf16"}]
    assert controller.precision.ffn == "bf16"
    controller.nonfinite.clear()
    assert torch.isfinite(model(torch.full((1, 4), 1e6))).all()
    assert controller.nonfinite == set()


def test_only_classes_in_reduced_precision_are_watched() -> None:
    """An fp32 class has no safer map to fall back to: its outputs are not checked (the
    check costs two passes over every output), and a job all in fp32 watches nothing."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    controller = PrecisionController(model, PrecisionMap())
    assert not controller.watches_any
    model(torch.full((1, 4), 3e38))  # Inf out of finite inputs, in fp32
    assert controller.nonfinite == set()
    bf16 = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    assert PrecisionController(bf16, PrecisionMap(ffn="bf16")).watches_any
    # A class the model does not have is not watched either.
    assert not PrecisionController(
        nn.Sequential(nn.Linear(4, 2)), PrecisionMap(ffn="bf16")
    ).watches_any


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_nonfinite_gradient_anywhere_is_found(bad: float) -> None:
    grads = [torch.randn(7, 3), torch.randn(50), torch.randn(4, 4)]
    assert _all_finite(grads)
    grads[1][17] = bad
    assert not _all_finite(grads)
    assert _all_finite([])


def test_loss_scaler_backs_off_and_grows() -> None:
    scaler = LossScaler(scale=8.0, growth_interval=2)
    scaler.update(True)
    assert scaler.scale == 4.0
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 8.0


# ----------------------------------------------------------------------------- options


def test_compression_and_precision_options(tmp_path) -> None:
    assert parse_compression("topk:0.01") == CompressionSpec(kind="topk", ratio=0.01)
    assert parse_compression("powersgd:4") == CompressionSpec(kind="powersgd", rank=4)
    assert parse_compression("int8").kind == "int8"
    for bad in ("topk", "topk:x", "zip", "int8:3", "powersgd:0"):
        with pytest.raises(InputError):
            parse_compression(bad)
    assert parse_precision("bf16") == PrecisionMap.uniform("bf16")
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"ffn": "fp8", "head": "bf16"}))
    assert parse_precision(str(path)) == PrecisionMap(ffn="fp8", head="bf16")
    path.write_text(json.dumps({"norm": "fp8"}))
    with pytest.raises(InputError, match="norm"):
        parse_precision(str(path))


@pytest.mark.subprocess
def test_job_run_exits_2_on_bad_input(tmp_path) -> None:
    done = subprocess.run(
        [*autotune_command(), "job", "run", "--task", "nope", "--steps", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "expected a built-in name" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "nope"], "expected a built-in name"),
        (["--task", "gpt-70b"], "is simulated only"),
        (["--task", "gpt-char", "--compression", "topk:2"], "ratio"),
        (["--task", "gpt-char", "--compression", "powersgd:2", "--tp", "2"], "PowerSGD"),
        (["--task", "gpt-char", "--precision", "fp4"], "--precision"),
        (["--task", "gpt-char", "--dp", "2", "--adaptive-topk"], "--compression topk:RATIO"),
        (["--task", "gpt-char", "--dp", "2", "--batch-shares", "2,1,1"], "one weight per rank"),
        (["--task", "gpt-char", "--dp", "2", "--batch-shares", "2,x"], "expected numbers"),
        (["--task", "gpt-char", "--dp", "2", "--batch-shares", "2,0"], "must be positive"),
        (["--task", "gpt-char", "--tp", "2", "--balance-batch"], "data-parallel-only"),
        (["--task", "gpt-char", "--stage-weights", "2,1"], "give --pp 2 or more"),
        (["--task", "gpt-char", "--pp", "2", "--stage-weights", "2,1,1"], "one weight per stage"),
        (["--task", "gpt-char", "--pp", "2", "--stage-weights", "2,-1"], "must be positive"),
        (
            [
                "--task",
                f"{REPO}/tests/data/pipeline_tasks.py:Split",
                "--pp",
                "2",
                "--stage-weights",
                "2,1",
            ],
            "gives its own split_points()",
        ),
        (
            ["--task", f"{REPO}/tests/data/hang_task.py:HangOnce", "--dp", "2", "--balance-batch"],
            "cannot split its batch unevenly",
        ),
    ],
)
def test_job_run_rejects_bad_input_with_exit_code_2(args: list[str], message: str) -> None:
    result = cli("job", "run", *args, "--steps", "1")
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- one rank


def run_one_rank(config_kwargs: dict[str, object], steps: int = 3) -> list[float]:
    """A single rank in this process (a one-member gloo group), no Ray."""
    import socket

    from autotune.core import JobConfig, Layout
    from autotune.executor.worker import RankWorker, WorkerSpec

    layout = config_kwargs.pop("layout", {})
    config = JobConfig(layout=Layout(world_size=1, **layout), **config_kwargs)  # type: ignore[arg-type]
    worker = RankWorker(0, WorkerSpec(task="gpt-char", config=config, batch_size=8))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker.setup("127.0.0.1", port)
    try:
        losses = [worker.step().loss for _ in range(steps)]
        if config.precision.optimizer_state == "bf16":
            for state in worker.optimizer.state.values():
                moment = state["exp_avg"]
                assert torch.equal(moment, moment.bfloat16().float())
        return losses
    finally:
        worker.close()


def test_gradient_accumulation_and_activation_checkpointing_keep_the_losses() -> None:
    plain = run_one_rank({})
    assert run_one_rank({"layout": {"micro_batches": 2}}) == pytest.approx(plain, rel=1e-5)
    assert run_one_rank({"layout": {"activation_checkpointing": True}}) == pytest.approx(
        plain, rel=1e-6
    )


def test_bf16_optimizer_state_is_rounded_to_bf16() -> None:
    losses = run_one_rank({"precision": PrecisionMap(optimizer_state="bf16")})
    assert losses[-1] < losses[0]
