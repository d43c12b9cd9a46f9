"""Precision maps applied to a live model, NaN/Inf detection with fall-back, loss scaling.

Each module that computes is put in a class of ``PrecisionMap`` by its type and name:
``nn.Embedding`` (and ``Linear``s named ``embed*``) -> embedding; separate q/k/v
projections and ``nn.MultiheadAttention`` -> attention_qkv; the output projection of an
attention module -> attention_out; norms -> norm; the model's last ``Linear`` when it is
a direct child of the model (or named ``*head*``) -> head; other ``Linear``s -> ffn.

A module of class ``c`` runs in the class's precision: its floating inputs and its
parameters are cast (differentiably, so the fp32 master weights get fp32 gradients) to
bf16 or fp16. ``fp8`` is emulated where there is no fp8 matmul: inputs and weights are
rounded through e4m3 with one scale per block of 128 (the ``quantize_blockwise`` /
``dequantize_blockwise`` kernels; straight-through gradients), then multiplied in bf16.
``optimizer_state="bf16"`` rounds Adam's moments to bf16 after every step (storage
emulation: the memory is not saved).

Every classed module's output is checked for NaN/Inf; the worker agrees the offending
classes across ranks, skips the step and moves those classes one step safer
(fp8 -> bf16, fp16 -> bf16, bf16 -> fp32). fp16 runs with dynamic loss scaling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from autotune.core import MODULE_CLASSES, Precision, PrecisionMap

__all__ = [
    "DTYPES",
    "SAFER",
    "LossScaler",
    "PrecisionController",
    "classify_modules",
]

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
            is_attention = bool(sibling_names & (_QKV | _QKV_FUSED)) or "attn" in parent.lower()
            if leaf.startswith("embed"):
                classes[name] = "embedding"
            elif leaf in _QKV_FUSED or (leaf in _QKV and is_attention):
                classes[name] = "attention_qkv"
            elif leaf in _OUT and is_attention:
                classes[name] = "attention_out"
            elif "head" in leaf or (name == last_linear and "." not in name):
                classes[name] = "head"
            else:
                classes[name] = "ffn"
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

    def __post_init__(self) -> None:
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
                args = tuple(
                    fake_quantize_fp8(a) if isinstance(a, Tensor) and a.is_floating_point() else a
                    for a in args
                )
                with _parameters_as(module, fake_quantize_fp8):
                    out = original(*args, **kwargs)
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
