"""Building one pipeline stage: the model as a skeleton on ``meta``, the stage's own
parameters and buffers given storage and values.

A stage holds its own parameters only (``build_stage``). The model is built as a
skeleton whose parameters are on the ``meta`` device (no storage; buffers are computed
for real, on CPU); ``plan_stages`` (``stage_plan``) gives every parameter to the stage
that uses it, and ``materialize`` gives the stage's own parameters and buffers storage on
the device and moves everything else to ``meta``. With one stage the stage is the whole
model, built as a single rank always built it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from autotune.catalog.tasks import FULL_INIT_MAX_BYTES
from autotune.executor.errors import ParallelError
from autotune.executor.stage_plan import StagePlan, plan_stages, single_stage_plan

__all__ = [
    "FULL_INIT_MAX_BYTES",
    "BuiltStage",
    "build_stage",
    "materialize",
    "parameter_bytes",
    "parameters_on_meta",
]


_RANDOM_FILLS = frozenset(
    {"normal_", "log_normal_", "cauchy_", "exponential_", "geometric_", "random_", "bernoulli_"}
)


class _SkipRandomFills(TorchFunctionMode):
    """In-place random fills of ``meta`` tensors do nothing (as they would), without
    running: ``normal_`` on ``meta`` goes through Python decompositions whose first use
    imports ~900 modules (sympy, mpmath; 1 s, 130,000 objects that every later full
    garbage collection walks: 160 ms pauses in training steps)."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _RANDOM_FILLS:
            target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(target, Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the ``meta`` device (each moved there as it
    is registered, so that no more than one parameter's storage exists at a time, and
    ``torch.empty`` leaves even that untouched) and their buffers computed for real, on
    CPU. Initialisations the constructor runs on parameters do nothing."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            moved = module._parameters[name]
            assert moved is not None
            module._parameters[name] = type(moved)(
                moved.to("meta"), requires_grad=moved.requires_grad
            )

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        with _SkipRandomFills():
            yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of parameter storage ``model`` holds (local shards; ``meta`` ones hold none)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if not local.is_meta:
            total += local.numel() * local.element_size()
    return total


def materialize(model: nn.Module, plan: StagePlan, stage: int, device: Any) -> None:
    """Give ``stage``'s parameters and buffers storage on ``device`` (uninitialised) and
    move every other one to ``meta`` (no storage). Tied parameters stay tied."""
    made: dict[int, nn.Parameter] = {}
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        for attr, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                own = plan.param_stage.get(dot + attr) == stage
                target = device if own else "meta"
                made[id(p)] = nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device=target),
                    requires_grad=p.requires_grad,
                )
            module._parameters[attr] = made[id(p)]
        for attr, b in list(module._buffers.items()):
            if b is None:
                continue
            own = stage in plan.buffer_stages.get(dot + attr, frozenset())
            module._buffers[attr] = torch.empty(
                b.shape, dtype=b.dtype, device=device if own else "meta"
            )


def _fill(model: nn.Module, values: Mapping[str, Tensor], names: set[str]) -> set[str]:
    """Copy ``values[name]`` into the parameters and buffers ``names`` for which it has
    one; returns the names filled."""
    filled = set()
    tensors: dict[str, Tensor] = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    with torch.no_grad():
        for name in names:
            value = values.get(name)
            if value is None:
                continue
            target = tensors[name]
            if tuple(value.shape) != tuple(target.shape):
                raise ParallelError(
                    f"the checkpoint's {name} has shape {tuple(value.shape)}, the model's "
                    f"{tuple(target.shape)}: it is not this model's checkpoint"
                )
            target.copy_(value)
            filled.add(name)
    return filled


def _module_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


def _reset_modules(model: nn.Module, names: set[str], seed: int, size: int) -> None:
    """Initialise the parameters ``names`` by their modules' ``reset_parameters()``, each
    module under a generator seeded by ``seed`` and its own name (so any layout gives a
    parameter the same values)."""
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        todo = [dot + n for n, _ in module.named_parameters(recurse=False) if dot + n in names]
        if not todo:
            continue
        reset = getattr(module, "reset_parameters", None) or getattr(
            module, "_reset_parameters", None
        )
        if not callable(reset):
            raise ParallelError(
                f"cannot initialise {todo[0]}: the model ({size / 2**30:.1f} GiB of "
                f"parameters) is above the limit for building it whole "
                f"(AUTOTUNE_FULL_INIT_MAX_BYTES={FULL_INIT_MAX_BYTES}), so each module is "
                f"initialised alone, and {type(module).__name__} has no reset_parameters(); "
                "start the job from a checkpoint or raise the limit"
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_module_seed(seed, prefix))
            reset()


def _move(model: nn.Module, names: set[str], device: Any) -> None:
    """Move the parameters and buffers ``names`` to ``device`` (in place: tied
    parameters stay one object)."""
    if torch.device(device) == torch.device("cpu"):
        return
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        for p in module._parameters.values():
            if p is not None and id(p) not in seen and not p.is_meta:
                seen.add(id(p))
                p.data = p.data.to(device)
        for attr, b in list(module._buffers.items()):
            if b is not None and dot + attr in names and not b.is_meta:
                module._buffers[attr] = b.to(device)


@dataclass
class BuiltStage:
    model: nn.Module
    """The whole module tree; only ``plan``'s tensors for this stage have storage."""
    plan: StagePlan
    sources: dict[str, int]
    """How many of the stage's tensors came from where: ``checkpoint``, ``full model``
    (built whole on CPU and dropped), ``module reset``, ``constructor`` (buffers)."""
    model_bytes: int
    """Parameter bytes of the whole model."""


def build_stage(
    build: Callable[[], nn.Module],
    *,
    seed: int,
    stages: int = 1,
    stage: int = 0,
    split_points: Callable[[nn.Module], Sequence[str]] | None = None,
    example: Tensor | None = None,
    device: Any = "cpu",
    values: Mapping[str, Tensor] | None = None,
    full_init_max_bytes: int | None = None,
) -> BuiltStage:
    """Pipeline stage ``stage`` of ``stages`` of the model ``build()`` makes, holding its
    own parameters and buffers only (see the module docstring), on ``device``.

    Values, for each of the stage's tensors, the first of:

    1. ``values`` (a checkpoint's tensors by parameter or buffer name);
    2. when the whole model has at most ``full_init_max_bytes`` of parameters
       (``FULL_INIT_MAX_BYTES``, 8 GiB unless ``AUTOTUNE_FULL_INIT_MAX_BYTES`` says
       otherwise): the full model, built on CPU after ``torch.manual_seed(seed)``, the
       stage's tensors copied and the rest dropped. Every layout gets the weights a single
       rank would, bit for bit, at the cost of building the whole model once per rank in
       host memory, transiently (device memory holds the stage only);
    3. above that: each module's ``reset_parameters()`` under a generator seeded by
       ``seed`` and the module's name: no rank ever holds more than its stage, and every
       layout gets the same weights (which layout-independent path is taken depends on
       the whole model's size only), but not the task's own initialisation (a custom
       ``normal_(0, 0.02)``, say): a model that needs it at that size starts from a
       checkpoint.

    A buffer ``values`` lacks comes from the full model when it is built anyway (2.),
    else from the skeleton's constructor, which computes buffers for real: right for
    deterministic ones (masks, rotary tables), not for one drawn at random (the skeleton
    skips the parameters' random initialisation, so its generator is elsewhere).

    Pipeline stages are planned on ``meta`` (``plan_stages``): the first time, torch
    imports its Python decompositions for it (about 145 MB of host memory and 1 s, once
    per process; no device memory).

    ``split_points(skeleton)`` names the blocks where stages begin and ``example`` is an
    input of the model's forward (any values: it runs on ``meta``); both are needed for
    ``stages > 1`` only.
    """
    limit = FULL_INIT_MAX_BYTES if full_init_max_bytes is None else full_init_max_bytes
    values = values or {}
    torch.manual_seed(seed)  # buffers drawn at construction: the same in every layout
    with parameters_on_meta():
        skeleton = build()
    size = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    if stages == 1 and size <= limit and not values:
        # The common case, as a single rank always built it: the full model is the stage.
        torch.manual_seed(seed)
        model = build().to(device)
        plan = single_stage_plan(model)
        count = len(plan.parameters(0)) + len(plan.buffers(0))
        return BuiltStage(model, plan, {"full model": count}, size)
    constructed = {name: b for name, b in skeleton.named_buffers()}
    for module in skeleton.modules():
        for attr, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[attr] = b.to("meta")
    if stages == 1:
        plan = single_stage_plan(skeleton)
    else:
        if split_points is None or example is None:
            raise ParallelError("a pipeline stage needs split points and an example input")
        meta_example = example.to("meta") if isinstance(example, Tensor) else example
        plan = plan_stages(skeleton, meta_example, list(split_points(skeleton)), stages)
    params, buffers = plan.parameters(stage), plan.buffers(stage)
    materialize(skeleton, plan, stage, "cpu")
    sources: dict[str, int] = {}
    filled = _fill(skeleton, values, params | buffers)
    if filled:
        sources["checkpoint"] = len(filled)
    missing = (params | buffers) - filled
    if missing and size <= limit and missing & params:
        torch.manual_seed(seed)
        reference = build()
        full: dict[str, Tensor] = dict(reference.named_parameters())
        full.update(reference.named_buffers())
        done = _fill(skeleton, full, missing)
        del reference, full
        sources["full model"] = len(done)
        missing -= done
    if missing & params:
        _reset_modules(skeleton, missing & params, seed, size)
        sources["module reset"] = len(missing & params)
        missing -= params
    if missing:
        done = _fill(skeleton, constructed, missing)
        sources["constructor"] = len(done)
    _move(skeleton, buffers, device)
    return BuiltStage(skeleton, plan, sources, size)
