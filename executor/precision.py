"""Precision maps applied to a live model, NaN/Inf detection with fall-back, loss scaling.

Each module that computes is put in a class of ``PrecisionMap`` by its type and name:
``nn.Embedding`` (and ``Linear``s named ``embed*``) -> embedding; separate q/k/v
projections and ``nn.MultiheadAttention`` -> attention_qkv; the output projection of an
attention module -> attention_out; norms -> norm; the model's last ``Linear`` when it is
a direct child of the model (or named ``*head*``) -> head; other ``Linear``s and
convolutions -> ffn.

A module of class ``c`` runs in the class's precision: its floating inputs and its
parameters are cast (differentiably, so the fp32 master weights get fp32 gradients) to
bf16 or fp16. ``fp8`` runs one of two ways, chosen once per controller (``fp8_mode``):

- ``"scaled_mm"``, on CUDA GPUs with fp8 units (compute capability >= 8.9: Ada, Hopper
  and later): an ``nn.Linear`` in an fp8 class multiplies e4m3 operands with
  ``torch._scaled_mm`` (fp32 scales per row of the input and per output row of the
  weight, or one per tensor where the GPU's torch has no row-wise kernel), bf16 out.
  The backward (``ScaledMMLinear``) multiplies in bf16 the operands saved in e4m3 and
  dequantised: the straight-through gradients of the emulation, from the operands the
  forward really used. Gradients are not rounded to e5m2: their range changes from step
  to step (a per-tensor e5m2 scale needs an amax history to be safe), so the two
  backward matmuls of the three run at bf16 speed and the gradients stay as exact as
  the emulation's; only the forward gains fp8's speed. A call
  whose shapes ``_scaled_mm`` refuses (a dimension not a multiple of 16, a sharded
  weight, extra arguments) is emulated instead; ``fp8_calls`` counts which ran. Should
  ``_scaled_mm`` raise all the same, the controller emulates from then on
  (``fp8_mode`` turns ``emulated``, ``fp8_error`` says why).
- ``"emulated"`` everywhere else, and for every other module in an fp8 class (norms,
  embeddings, attention modules): inputs and weights are rounded through e4m3 with one
  scale per block of 128 (the ``quantize_blockwise`` / ``dequantize_blockwise`` kernels;
  straight-through gradients), then multiplied in bf16.

``AUTOTUNE_FP8_MODE=emulated`` (or ``scaled_mm``) overrides the choice (benchmarks
compare the two on one GPU; ``scaled_mm`` on a CPU runs torch's CPU kernel, for tests).
``optimizer_state="bf16"`` rounds Adam's moments to bf16 after every step (storage
emulation: the memory is not saved).

Every classed module's output is checked for NaN/Inf; the worker agrees the offending
classes across ranks, skips the step and moves those classes one step safer
(fp8 -> bf16, fp16 -> bf16, bf16 -> fp32). fp16 runs with dynamic loss scaling.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from autotune.core import MODULE_CLASSES, Precision, PrecisionMap

__all__ = [
    "DTYPES",
    "FP8_MODE_ENV",
    "SAFER",
    "Fp8Mode",
    "LossScaler",
    "PrecisionController",
    "ScaledMMLinear",
    "classify_modules",
    "fp8_linear",
    "scaled_mm_supported",
    "select_fp8_mode",
]

Fp8Mode = Literal["scaled_mm", "emulated"]
FP8_MODE_ENV = "AUTOTUNE_FP8_MODE"
"""Environment variable overriding the fp8 path: ``auto`` (default), ``scaled_mm`` or
``emulated``."""

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,  # the matmul dtype after fp8 rounding
}
SAFER: dict[str, Precision] = {"fp8": "bf16", "fp16": "bf16", "bf16": "fp32"}

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.RMSNorm)
_QKV = {"q_proj", "k_proj", "v_proj", "query", "key", "value", "wq", "wk", "wv", "q", "k", "v"}
_QKV_FUSED = {"qkv", "c_attn", "in_proj", "qkv_proj", "wqkv"}
_OUT = {"out_proj", "o_proj", "wo", "out", "c_proj", "proj", "dense"}
COMPUTE_CLASSES = tuple(c for c in MODULE_CLASSES if c != "optimizer_state")


def classify_modules(model: nn.Module) -> dict[str, str]:
    """Module name -> precision class, for every module the map governs."""
    classes: dict[str, str] = {}
    modules = dict(model.named_modules())
    inside_mha = {
        f"{name}.{child}" if name else child
        for name, m in modules.items()
        if isinstance(m, nn.MultiheadAttention)
        for child, _ in m.named_modules()
        if child
    }
    last_linear = next(
        (n for n, m in reversed(list(modules.items())) if isinstance(m, nn.Linear)), None
    )
    for name, module in modules.items():
        if name in inside_mha:
            continue
        leaf = name.rsplit(".", 1)[-1]
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if isinstance(module, nn.MultiheadAttention):
            classes[name] = "attention_qkv"
        elif isinstance(module, nn.Embedding):
            classes[name] = "embedding"
        elif isinstance(module, _NORMS):
            classes[name] = "norm"
        elif isinstance(module, nn.Linear):
            parent_module = modules.get(parent)
            sibling_names = (
                {n for n, _ in parent_module.named_children()}
                if parent_module is not None
                else set()
            )
            is_attention = bool(sibling_names & (_QKV | _QKV_FUSED)) or any(
                word in parent.lower() for word in ("attn", "attention")
            )
            if leaf.startswith("embed"):
                classes[name] = "embedding"
            elif leaf in _QKV_FUSED or (leaf in _QKV and is_attention):
                classes[name] = "attention_qkv"
            elif leaf in _OUT and is_attention:
                classes[name] = "attention_out"
            elif (
                "head" in leaf
                or name.split(".", 1)[0].endswith("head")
                or (name == last_linear and "." not in name)
            ):
                classes[name] = "head"
            else:
                classes[name] = "ffn"
        elif isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            classes[name] = "ffn"  # a convolution is the compute of a conv net's blocks
    return classes


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype) for v in value)
    return value


def _finite(value: Any) -> bool:
    if not (isinstance(value, Tensor) and value.is_floating_point()):
        return True
    local = value.to_local() if hasattr(value, "to_local") else value
    return bool(torch.isfinite(local).all())


def fake_quantize_fp8(t: Tensor) -> Tensor:
    """``t`` rounded through blockwise e4m3 (per-128 scales), in bf16, with a
    straight-through gradient."""
    from autotune.kernels import dequantize_blockwise, quantize_blockwise

    if hasattr(t, "to_local"):  # a tensor-parallel shard: round the local block
        from torch.distributed.tensor import DTensor

        assert isinstance(t, DTensor)
        local = fake_quantize_fp8(t.to_local())
        return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False)
    source = t.detach().float().contiguous()
    q, scales, _ = quantize_blockwise(source, 128, "fp8_e4m3")
    rounded = dequantize_blockwise(q, scales, 128, torch.float32)
    return (t + (rounded - t).detach()).to(torch.bfloat16)


# --------------------------------------------------------------------------- real fp8

E4M3_MAX = 448.0
_ROWWISE: dict[tuple[str, int | None], bool] = {}
"""Per device: whether ``_scaled_mm`` took row-wise scales there (found on first use)."""


def scaled_mm_supported(device: torch.device | str) -> bool:
    """Whether fp8 matmuls run natively on ``device``: a CUDA GPU of compute capability
    >= 8.9 and a torch with ``_scaled_mm`` and e4m3."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= (8, 9)


def select_fp8_mode(device: torch.device | str, requested: str | None = None) -> Fp8Mode:
    """The fp8 path on ``device``: ``requested`` (else ``$AUTOTUNE_FP8_MODE``, else
    ``auto``); ``auto`` takes ``scaled_mm`` where :func:`scaled_mm_supported`."""
    choice = requested if requested is not None else os.environ.get(FP8_MODE_ENV, "auto")
    choice = choice.strip().lower() or "auto"
    if choice == "auto":
        return "scaled_mm" if scaled_mm_supported(device) else "emulated"
    if choice not in get_args(Fp8Mode):
        raise ValueError(f"{FP8_MODE_ENV} must be auto, scaled_mm or emulated, not {choice!r}")
    return choice  # type: ignore[return-value]


def _to_e4m3(t: Tensor, rowwise: bool) -> tuple[Tensor, Tensor]:
    """``t`` (2-D) in e4m3 and its fp32 dequantisation scales: one per row, shape
    ``(rows, 1)``, or one for the tensor, shape ``()``. A NaN or Inf makes the product
    non-finite (so the class falls back)."""
    source = t.detach().float()
    amax = source.abs().amax(dim=1, keepdim=True) if rowwise else source.abs().amax()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (source / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _scaled_mm(x: Tensor, w: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``x @ w.T`` (x: (M, K), w: (N, K)) through ``torch._scaled_mm``; also returns the
    e4m3 operands and their scales. Row-wise scales where the device's kernel takes them,
    per-tensor scales otherwise."""
    key = (x.device.type, x.device.index)
    rowwise = _ROWWISE.get(key, True)
    while True:
        xq, xs = _to_e4m3(x, rowwise)
        wq, ws = _to_e4m3(w, rowwise)
        try:
            out = torch._scaled_mm(
                xq,
                wq.t(),  # column-major, as _scaled_mm requires of its second operand
                scale_a=xs,
                scale_b=ws.reshape(1, -1) if rowwise else ws,
                out_dtype=torch.bfloat16,
            )
        except RuntimeError:
            if not rowwise:
                raise
            rowwise = False  # no row-wise kernel here (older torch or GPU): per tensor
            continue
        _ROWWISE[key] = rowwise
        return out, (xq, xs, wq, ws)


class ScaledMMLinear(torch.autograd.Function):
    """``x @ w.T`` with e4m3 operands through ``torch._scaled_mm`` (bf16 out); the
    backward multiplies the dequantised e4m3 operands in bf16 (straight-through)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor) -> Tensor:
        out, saved = _scaled_mm(x, w)
        ctx.save_for_backward(*saved)
        ctx.dtypes = (x.dtype, w.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        xq, xs, wq, ws = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        g = grad.to(torch.bfloat16)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            w = (wq.float() * ws).to(torch.bfloat16)
            grad_x = (g @ w).to(x_dtype)
        if ctx.needs_input_grad[1]:
            x = (xq.float() * xs).to(torch.bfloat16)
            grad_w = (g.t() @ x).to(w_dtype)
        return grad_x, grad_w


def _is_sharded(t: Tensor) -> bool:
    return hasattr(t, "to_local")


def fp8_linear(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """``module(*args)`` through :class:`ScaledMMLinear` (plus the bias, in bf16), or
    ``None`` where ``_scaled_mm`` cannot take the call: not a plain ``nn.Linear`` with one
    floating input, a sharded (tensor-parallel) weight or input, or M, K or N not a
    multiple of 16."""
    if not (
        isinstance(module, nn.Linear)
        and type(module).forward is nn.Linear.forward
        and len(args) == 1
        and not kwargs
    ):
        return None
    x, w = args[0], module.weight
    if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 1):
        return None
    if _is_sharded(x) or _is_sharded(w) or x.device != w.device:
        return None
    n, k = w.shape
    m = x.numel() // k if k else 0
    if x.shape[-1] != k or m == 0 or m % 16 or k % 16 or n % 16:
        return None
    apply: Any = ScaledMMLinear.apply  # torch leaves Function.apply untyped
    out: Tensor = apply(x.reshape(m, k), w)
    out = out.reshape(*x.shape[:-1], n)
    if module.bias is not None:
        out = out + module.bias.to(torch.bfloat16)
    return out


@contextmanager
def _parameters_as(module: nn.Module, cast: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """Temporarily replace ``module``'s own and its children's parameters by ``cast(p)``."""
    saved: list[tuple[nn.Module, str, Any]] = []
    try:
        for owner in module.modules():
            for name, p in list(owner._parameters.items()):
                if p is not None and p.is_floating_point():
                    saved.append((owner, name, p))
                    owner._parameters[name] = cast(p)  # type: ignore[assignment]
        yield
    finally:
        for owner, name, p in saved:
            owner._parameters[name] = p


@dataclass
class PrecisionController:
    """Applies a precision map to a model and watches its outputs for NaN/Inf."""

    model: nn.Module
    precision: PrecisionMap
    classes: dict[str, str] = field(default_factory=dict)
    nonfinite: set[str] = field(default_factory=set)
    """Classes that turned finite inputs into NaN/Inf in the current step."""
    watching: bool = True
    fp8: str | None = None
    """The fp8 path asked for: ``auto``, ``scaled_mm`` or ``emulated``; ``None`` reads
    ``$AUTOTUNE_FP8_MODE`` (default ``auto``)."""
    fp8_mode: Fp8Mode = field(init=False, default="emulated")
    """How the ``nn.Linear`` layers of fp8 classes multiply: ``scaled_mm`` (real fp8, on
    GPUs with fp8 units) or ``emulated``; chosen by :func:`select_fp8_mode` for the
    device of the model's parameters (move the model first)."""
    fp8_calls: dict[str, int] = field(default_factory=lambda: {"scaled_mm": 0, "emulated": 0})
    """fp8 ``nn.Linear`` forwards so far by the path that ran (under ``scaled_mm``, a call
    with shapes ``_scaled_mm`` refuses is emulated)."""
    fp8_error: str | None = field(init=False, default=None)
    """Why ``scaled_mm`` was given up for the emulation mid-run (``None``: it was not)."""

    def __post_init__(self) -> None:
        parameter = next(self.model.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        self.fp8_mode = select_fp8_mode(device, self.fp8)
        self.classes = classify_modules(self.model)
        modules = dict(self.model.named_modules())
        for name, cls in self.classes.items():
            module = modules[name]
            original = module.forward
            module.forward = self._wrap(module, cls, original)

    def _wrap(
        self, module: nn.Module, cls: str, original: Callable[..., Any]
    ) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            precision = getattr(self.precision, cls)
            if precision == "fp32":
                out = original(*_cast(args, torch.float32), **kwargs)
            elif precision == "fp8":
                out = self._scaled_mm_linear(module, args, kwargs)
                if out is not None:
                    self.fp8_calls["scaled_mm"] += 1
                else:
                    if isinstance(module, nn.Linear):
                        self.fp8_calls["emulated"] += 1
                    out = self._emulated_fp8(module, original, args, kwargs)
            else:
                dtype = DTYPES[precision]
                with _parameters_as(module, lambda p: p.to(dtype)):
                    out = original(*_cast(args, dtype), **kwargs)
            # Only a class in reduced precision is watched: an fp32 class has no safer
            # map to fall back to (a non-finite gradient still skips the step), and the
            # check costs two passes over every output it watches.
            if self.watching and precision != "fp32":
                first = out[0] if isinstance(out, tuple) else out
                if not _finite(first) and all(_finite(a) for a in args):
                    self.nonfinite.add(cls)  # this module made finite inputs non-finite
            return out

        return forward

    def _scaled_mm_linear(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor | None:
        """:func:`fp8_linear` under ``scaled_mm``; ``None`` to emulate. Should
        ``_scaled_mm`` refuse a call the checks let through, the controller emulates from
        then on and keeps the reason in ``fp8_error``."""
        if self.fp8_mode != "scaled_mm":
            return None
        try:
            return fp8_linear(module, args, kwargs)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as exc:
            self.fp8_mode = "emulated"
            self.fp8_error = repr(exc)
            return None

    @staticmethod
    def _emulated_fp8(
        module: nn.Module, original: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        args = tuple(
            fake_quantize_fp8(a) if isinstance(a, Tensor) and a.is_floating_point() else a
            for a in args
        )
        with _parameters_as(module, fake_quantize_fp8):
            return original(*args, **kwargs)

    @property
    def uses_fp8(self) -> bool:
        """Whether any class the model has runs in fp8."""
        return any(getattr(self.precision, cls) == "fp8" for cls in set(self.classes.values()))

    @property
    def watches_any(self) -> bool:
        """Whether any class runs in reduced precision (only those are watched)."""
        return any(getattr(self.precision, cls) != "fp32" for cls in set(self.classes.values()))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Ignore outputs computed inside (shape inference on uninitialised tensors)."""
        self.watching = False
        try:
            yield
        finally:
            self.watching = True

    @property
    def uses_fp16(self) -> bool:
        return any(getattr(self.precision, c) == "fp16" for c in COMPUTE_CLASSES)

    def fall_back(self, classes: set[str]) -> list[dict[str, Any]]:
        """Move ``classes`` one step safer; returns the changes made."""
        changes: dict[str, Precision] = {}
        events = []
        for cls in sorted(classes):
            current = getattr(self.precision, cls)
            if current in SAFER:
                changes[cls] = SAFER[current]
                events.append({"module_class": cls, "from": current, "to": SAFER[current]})
            else:
                events.append({"module_class": cls, "from": current, "to": current})
        if changes:
            self.precision = replace(self.precision, **changes)
        return events

    def round_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        if self.precision.optimizer_state != "bf16":
            return
        for state in optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                moment = state.get(key)
                if isinstance(moment, Tensor):
                    moment.copy_(moment.to(torch.bfloat16))


@dataclass
class LossScaler:
    """Dynamic loss scaling (as ``torch.amp.GradScaler``), with the overflow decision
    taken by the caller across all ranks."""

    scale: float = 2.0**12
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 200
    good_steps: int = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale = max(self.scale * self.backoff_factor, 1.0)
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0

    def state(self) -> dict[str, float]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load(self, state: dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
