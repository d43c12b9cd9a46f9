"""fp8 for real (``torch._scaled_mm``) and emulated: which path is chosen, that the
emulation is what it was, and the ``ScaledMMLinear`` autograd Function against bf16.

The CPU tests run torch's CPU ``_scaled_mm`` (skipped where this torch has none); the
CUDA tests run on a GPU only and never decide whether the rest pass."""

from __future__ import annotations

import dataclasses
import socket

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from autotune.core import JobConfig, Layout, PrecisionMap
from autotune.executor import precision as precision_module
from autotune.executor.precision import (
    FP8_MODE_ENV,
    PrecisionController,
    ScaledMMLinear,
    fake_quantize_fp8,
    scaled_mm_supported,
    select_fp8_mode,
)
from autotune.executor.tasks import GPTChar


def _cpu_scaled_mm() -> bool:
    try:
        one = torch.ones((), dtype=torch.float32)
        a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


needs_cpu_scaled_mm = pytest.mark.skipif(
    not _cpu_scaled_mm(), reason="this torch has no CPU _scaled_mm"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().float(), expected.detach().float()
    return float((actual - expected).norm() / expected.norm())


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FP8_MODE_ENV, raising=False)


# ----------------------------------------------------------------------------- selection


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((7, 0), "emulated"),
        ((8, 0), "emulated"),
        ((8, 6), "emulated"),
        ((8, 9), "scaled_mm"),
        ((9, 0), "scaled_mm"),
        ((10, 0), "scaled_mm"),
    ],
)
def test_scaled_mm_is_chosen_on_gpus_with_fp8_units(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert select_fp8_mode("cuda") == expected
    assert select_fp8_mode(torch.device("cuda", 0)) == expected
    assert scaled_mm_supported("cuda") == (expected == "scaled_mm")
    # A CPU model emulates whatever the GPU could do.
    assert select_fp8_mode("cpu") == "emulated"


def test_without_cuda_fp8_is_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_fp8_mode("cuda") == "emulated"
    assert select_fp8_mode("cpu") == "emulated"


def test_the_environment_and_the_argument_override_the_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv(FP8_MODE_ENV, "emulated")
    assert select_fp8_mode("cuda") == "emulated"
    monkeypatch.setenv(FP8_MODE_ENV, "scaled_mm")
    assert select_fp8_mode("cpu") == "scaled_mm"
    assert select_fp8_mode("cpu", "auto") == "emulated"
    assert select_fp8_mode("cuda", "emulated") == "emulated"
    monkeypatch.setenv(FP8_MODE_ENV, "fp4")
    with pytest.raises(ValueError, match=FP8_MODE_ENV):
        select_fp8_mode("cuda")


def test_the_controller_chooses_for_the_models_device() -> None:
    model = nn.Sequential(nn.Linear(32, 32))
    controller = PrecisionController(model, PrecisionMap(head="fp8"))
    assert controller.fp8_mode == "emulated"  # a CPU model
    assert controller.uses_fp8
    assert not PrecisionController(nn.Sequential(nn.Linear(32, 32)), PrecisionMap()).uses_fp8
    forced = PrecisionController(nn.Sequential(nn.Linear(32, 32)), PrecisionMap(), fp8="scaled_mm")
    assert forced.fp8_mode == "scaled_mm"


# ----------------------------------------------------------------------------- emulation


def test_the_emulated_path_rounds_every_operand_blockwise() -> None:
    """Unchanged by the real path: inputs, weight and bias through blockwise e4m3, then
    F.linear in bf16; every fp8 Linear call counted as emulated."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 64)
    model = nn.Sequential(linear, nn.Identity())
    controller = PrecisionController(model, PrecisionMap(head="fp8"))
    x = torch.randn(8, 256)
    out = model(x)
    expected = F.linear(
        fake_quantize_fp8(x), fake_quantize_fp8(linear.weight), fake_quantize_fp8(linear.bias)
    )
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    assert controller.fp8_calls == {"scaled_mm": 0, "emulated": 1}
    out.float().sum().backward()
    # straight-through: the weight's gradient is x (rounded) summed over the batch
    assert linear.weight.grad is not None
    torch.testing.assert_close(
        linear.weight.grad,
        fake_quantize_fp8(x).float().sum(0).expand(64, -1),
        atol=0.05,
        rtol=0.02,
    )


# ----------------------------------------------------------------------------- scaled_mm


def _check_scaled_mm_linear(device: torch.device) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 256, device=device, requires_grad=True)
    w = (0.05 * torch.randn(96, 256, device=device)).requires_grad_()
    out = ScaledMMLinear.apply(x, w)
    assert out.dtype == torch.bfloat16
    assert out.shape == (64, 96)
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    reference = xr.bfloat16() @ wr.bfloat16().t()
    # e4m3 keeps 3 mantissa bits: ~2-4 % relative error on random operands
    assert _relative(out, reference) < 0.06
    grad = torch.randn_like(out)
    out.backward(grad)
    reference.backward(grad)
    assert x.grad is not None
    assert w.grad is not None
    assert x.grad.dtype == w.grad.dtype == torch.float32
    assert xr.grad is not None
    assert wr.grad is not None
    assert _relative(x.grad, xr.grad) < 0.06
    assert _relative(w.grad, wr.grad) < 0.06


@needs_cpu_scaled_mm
def test_scaled_mm_linear_matches_bf16_on_cpu() -> None:
    _check_scaled_mm_linear(torch.device("cpu"))


@needs_cuda
def test_scaled_mm_linear_matches_bf16_on_a_gpu() -> None:
    if not scaled_mm_supported("cuda"):
        pytest.skip(f"compute capability {torch.cuda.get_device_capability()} < 8.9")
    _check_scaled_mm_linear(torch.device("cuda"))


@needs_cpu_scaled_mm
def test_without_row_wise_kernels_scales_are_per_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    real = torch._scaled_mm
    shapes: list[tuple[int, ...]] = []

    def tensorwise_only(a: torch.Tensor, b: torch.Tensor, **kwargs: object) -> torch.Tensor:
        scale_a = kwargs["scale_a"]
        assert isinstance(scale_a, torch.Tensor)
        shapes.append(tuple(scale_a.shape))
        if scale_a.numel() != 1:
            raise RuntimeError("Invalid scaling configuration")
        return real(a, b, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(precision_module, "_ROWWISE", {})
    monkeypatch.setattr(torch, "_scaled_mm", tensorwise_only)
    x, w = torch.randn(32, 64), torch.randn(16, 64)
    out = ScaledMMLinear.apply(x, w)
    assert shapes == [(32, 1), ()]
    assert precision_module._ROWWISE == {("cpu", None): False}
    assert _relative(out, x @ w.t()) < 0.06
    ScaledMMLinear.apply(x, w)
    assert shapes == [(32, 1), (), ()]  # remembered


@needs_cpu_scaled_mm
def test_fp8_linears_run_scaled_mm_and_odd_shapes_fall_back() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 10))  # 10: not /16
    fp8 = PrecisionMap(ffn="fp8", head="fp8")
    controller = PrecisionController(model, fp8, fp8="scaled_mm")
    assert controller.classes == {"0": "ffn", "2": "head"}
    x = torch.randn(4, 8, 64)  # M = 32 rows
    out = model(x)
    assert out.shape == (4, 8, 10)
    assert out.dtype == torch.bfloat16
    assert controller.fp8_calls == {"scaled_mm": 1, "emulated": 1}
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    model(torch.randn(5, 64))  # M = 5: both emulated
    assert controller.fp8_calls == {"scaled_mm": 1, "emulated": 3}


def test_a_scaled_mm_that_raises_hands_the_controller_to_the_emulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("CUDA error: no kernel image is available")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    model = nn.Sequential(linear, nn.Identity())
    controller = PrecisionController(model, PrecisionMap(head="fp8"), fp8="scaled_mm")
    x = torch.randn(16, 64)
    out = model(x)
    assert controller.fp8_mode == "emulated"
    assert controller.fp8_error is not None
    assert "no kernel image" in controller.fp8_error
    assert controller.fp8_calls == {"scaled_mm": 0, "emulated": 1}
    expected = F.linear(
        fake_quantize_fp8(x), fake_quantize_fp8(linear.weight), fake_quantize_fp8(linear.bias)
    )
    assert torch.equal(out, expected)


@needs_cpu_scaled_mm
def test_gpt_char_trains_as_well_with_scaled_mm_as_emulated() -> None:
    """uniform fp8: the 6 Linears of each of the 4 blocks in fp8 (embedding and head in
    bf16); the emulation's kernels in their reference (the interpreter is slow)."""
    from autotune.kernels import use_backend

    task = GPTChar(batch_size=8)
    final = {}
    for mode in ("emulated", "scaled_mm"):
        torch.manual_seed(0)
        model = task.build_model()
        controller = PrecisionController(model, PrecisionMap.uniform("fp8"), fp8=mode)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        batches = task.batches(0, 1, seed=0)
        losses = []
        for _ in range(8):
            with use_backend("reference"):
                loss = task.loss(model, next(batches))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        assert losses[-1] < losses[0] - 1.0, losses
        assert controller.nonfinite == set()
        final[mode] = losses[-1]
        linears = controller.fp8_calls
        assert linears[mode] == 8 * 4 * 6
        assert sum(linears.values()) == linears[mode]
    assert final["scaled_mm"] == pytest.approx(final["emulated"], abs=0.15)


@needs_cuda
def test_a_gpu_model_uses_scaled_mm_where_the_gpu_has_fp8_units() -> None:
    torch.manual_seed(0)
    task = GPTChar(batch_size=16)
    model = task.build_model().cuda()
    controller = PrecisionController(model, PrecisionMap.uniform("fp8"))
    expected = "scaled_mm" if scaled_mm_supported("cuda") else "emulated"
    assert controller.fp8_mode == expected
    inputs, targets = next(task.batches(0, 1, seed=0))
    loss = task.loss(model, (inputs.cuda(), targets.cuda()))
    loss.backward()
    assert torch.isfinite(loss)
    assert controller.fp8_calls[expected] == 4 * 6


# ----------------------------------------------------------------------------- worker


@pytest.mark.parametrize(("precision", "expected"), [("fp8", "emulated"), ("bf16", None)])
def test_worker_steps_say_which_fp8_path_ran(precision: str, expected: str | None) -> None:
    from autotune.executor.worker import RankWorker, WorkerSpec

    config = JobConfig(layout=Layout(world_size=1), precision=PrecisionMap.uniform(precision))  # type: ignore[arg-type]
    worker = RankWorker(0, WorkerSpec(task="gpt-char", config=config, batch_size=4))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker.setup("127.0.0.1", port)
    try:
        metrics = dataclasses.asdict(worker.step())
    finally:
        worker.close()
    assert metrics["fp8_mode"] == expected
