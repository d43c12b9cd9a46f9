"""Tensor- and pipeline-parallel splitting of a task's model.

Tensor parallelism goes through ``DeviceMesh`` + ``parallelize_module``. The plan comes
from the task's ``tp_plan()`` or is derived for the common patterns: attention whose
q/k/v/out projections are separate ``nn.Linear`` children (column-wise q/k/v, row-wise
out) and feed-forward pairs of consecutive ``nn.Linear`` children that widen then narrow
(``nn.TransformerEncoderLayer``'s ``linear1``/``linear2``, GPT MLPs). The model's
forward must infer the number of local heads from the width (``view(b, t, -1, d)``).

Pipeline parallelism goes through ``torch.distributed.pipelining``. Stages begin at the
task's ``split_points()`` or at even cuts of the model's largest stack of identical
blocks (an ``nn.ModuleList``, as in ``nn.TransformerEncoder.layers``).

A stage holds its own parameters only (``build_stage``). The model is built as a
skeleton whose parameters are on the ``meta`` device (no storage; buffers are computed
for real, on CPU); ``plan_stages`` runs the skeleton's forward once on ``meta`` inputs
and gives every parameter to the one stage that uses it: a block's to the stage of the
block, what runs before the block stack (embeddings) to the first stage, what runs
after it (final norm, head) to the last. A parameter used by two stages (weights tied
across the cut) is refused, naming it. ``materialize`` then gives the stage's own
parameters and buffers storage on the device and moves everything else to ``meta``.

Each stage keeps the whole module tree (the names the checkpoints, the tensor-parallel
plan and the precision classes use), and runs the model's own forward: blocks outside
its range pass their input through, the first block of a later stage takes the received
activation in place of its input, and the last block of an earlier stage ends the
forward and sends its output. A later stage runs what comes before its first block on
``meta`` tensors (a shape-only template of the input, under ``torch.device("meta")``):
it costs no memory and no arithmetic. So a model's forward may compute between the
block stack's start and a stage's first block only from the input and the parameters;
what it passes to a block besides the activation (a mask) must not be needed by a later
stage.
"""

from __future__ import annotations

import itertools
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from autotune.errors import InputError

__all__ = [
    "FULL_INIT_MAX_BYTES",
    "BuiltStage",
    "ParallelError",
    "StageModule",
    "StagePlan",
    "apply_activation_checkpointing",
    "apply_tensor_parallel",
    "build_stage",
    "derive_split_points",
    "derive_tp_plan",
    "find_blocks",
    "materialize",
    "parameter_bytes",
    "parameters_on_meta",
    "plan_stages",
    "replay",
    "single_stage_plan",
    "stage_ranges",
]

FULL_INIT_MAX_BYTES = int(os.environ.get("AUTOTUNE_FULL_INIT_MAX_BYTES", 8 << 30))
"""Largest model (bytes of parameters) that ``build_stage`` builds whole, on CPU, to give
a stage the full model's initial weights bit for bit (see ``build_stage``)."""

_QKV_NAMES = (
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("wq", "wk", "wv"),
    ("q", "k", "v"),
)
_OUT_NAMES = ("out_proj", "o_proj", "wo", "out", "c_proj", "proj", "dense")


class ParallelError(InputError):
    """A model that cannot be split as asked; the message says why and what to provide."""


# --------------------------------------------------------------------------------------
# Tensor parallelism
# --------------------------------------------------------------------------------------


def _linear_children(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, c) for n, c in module.named_children() if isinstance(c, nn.Linear)]


def derive_tp_plan(model: nn.Module) -> dict[str, str]:
    """Module name -> ``"colwise"`` | ``"rowwise"`` for the patterns the module docstring
    lists; empty when none is found."""
    plan: dict[str, str] = {}
    for prefix, module in model.named_modules():
        linears = _linear_children(module)
        names = {n for n, _ in linears}
        dot = f"{prefix}." if prefix else ""
        qkv = next((group for group in _QKV_NAMES if set(group) <= names), None)
        if qkv is not None:
            out = next((n for n in _OUT_NAMES if n in names), None)
            if out is not None:
                for n in qkv:
                    plan[dot + n] = "colwise"
                plan[dot + out] = "rowwise"
                continue
        for (n1, l1), (n2, l2) in itertools.pairwise(linears):
            if dot + n1 in plan or dot + n2 in plan:
                continue
            widens = l1.out_features > l1.in_features
            if widens and l1.out_features == l2.in_features and l2.out_features == l1.in_features:
                plan[dot + n1] = "colwise"
                plan[dot + n2] = "rowwise"
    return plan


def _check_tp_plan(model: nn.Module, plan: dict[str, Any], tp: int) -> None:
    modules = dict(model.named_modules())
    for name, style in plan.items():
        module = modules.get(name)
        if module is None:
            raise ParallelError(f"tensor-parallel plan names {name!r}, which the model lacks")
        if isinstance(module, nn.Linear) and isinstance(style, str):
            width = module.out_features if style == "colwise" else module.in_features
            if width % tp:
                raise ParallelError(
                    f"cannot shard {name} {style} over {tp} ranks: width {width} is not divisible"
                )


def apply_tensor_parallel(
    model: nn.Module,
    mesh: Any,
    plan: dict[str, Any] | None,
    *,
    keep: Callable[[str], bool] | None = None,
) -> dict[str, str]:
    """Shard ``model`` in place over the 1-D ``mesh``; returns the plan used. With
    ``keep``, only the modules it accepts are sharded (a pipeline stage's own: the others
    hold no storage); the plan is checked whole first."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    chosen = dict(plan) if plan is not None else derive_tp_plan(model)
    if not chosen:
        raise ParallelError(
            f"cannot split {type(model).__name__} for tensor parallelism: no separate q/k/v/out "
            "projections and no widening/narrowing nn.Linear pair found; give the task a "
            "tp_plan() (module name -> 'colwise' | 'rowwise')"
        )
    tp = mesh.size()
    _check_tp_plan(model, chosen, tp)
    if keep is not None:
        chosen = {name: style for name, style in chosen.items() if keep(name)}
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    resolved = {}
    for name, style in chosen.items():
        if isinstance(style, str):
            if style not in styles:
                raise ParallelError(
                    f"tensor-parallel style {style!r} for {name}: use colwise|rowwise"
                )
            resolved[name] = styles[style]()
        else:
            resolved[name] = style
    if resolved:
        parallelize_module(model, mesh, resolved)
    return {n: s if isinstance(s, str) else type(s).__name__ for n, s in chosen.items()}


# --------------------------------------------------------------------------------------
# Blocks, pipeline stages, activation checkpointing
# --------------------------------------------------------------------------------------


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The largest ``nn.ModuleList`` of at least two modules of one class."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) >= 2:
            if len({type(m) for m in module}) != 1:
                continue
            size = sum(p.numel() for p in module.parameters())
            if best is None or size > best[0]:
                best = (size, name, module)
    if best is None:
        raise ParallelError(
            f"cannot find a stack of blocks in {type(model).__name__} (an nn.ModuleList of "
            "identical modules, as nn.TransformerEncoder has): give the task split_points()"
        )
    return best[1], best[2]


def derive_split_points(model: nn.Module, stages: int) -> list[str]:
    """Names of the blocks where stages ``1..stages-1`` begin: even cuts of the stack."""
    name, blocks = find_blocks(model)
    if len(blocks) < stages:
        raise ParallelError(
            f"cannot split {len(blocks)} blocks ({name}) into {stages} pipeline stages"
        )
    cuts = [round(i * len(blocks) / stages) for i in range(1, stages)]
    return [f"{name}.{c}" for c in cuts]


def stage_ranges(
    model: nn.Module, split_points: Sequence[str], stages: int
) -> tuple[str, list[range]]:
    """The block stack's name and each stage's range of block indices."""
    if len(split_points) != stages - 1:
        raise ParallelError(
            f"{stages} pipeline stages need {stages - 1} split points, got {list(split_points)}"
        )
    parents, cuts = set(), []
    for point in split_points:
        match = re.fullmatch(r"(.+)\.(\d+)", point)
        if match is None:
            raise ParallelError(f"split point {point!r} is not '<module list>.<index>'")
        parents.add(match.group(1))
        cuts.append(int(match.group(2)))
    if len(parents) != 1:
        raise ParallelError(f"split points {list(split_points)} span several module lists")
    parent = parents.pop()
    blocks = dict(model.named_modules()).get(parent)
    if not isinstance(blocks, nn.ModuleList):
        raise ParallelError(f"split points name {parent!r}, which is not an nn.ModuleList")
    bounds = [0, *cuts, len(blocks)]
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise ParallelError(
            f"split points {list(split_points)} must be increasing and inside 1..{len(blocks) - 1}"
        )
    return parent, [range(a, b) for a, b in itertools.pairwise(bounds)]


# --------------------------------------------------------------------------------------
# Stage ownership: which stage holds which parameter
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagePlan:
    """Which pipeline stage holds each parameter and buffer of a model."""

    stages: int
    parent: str | None
    """The block stack's module name (``None`` for a single stage)."""
    ranges: tuple[range, ...]
    """Each stage's block indices."""
    param_stage: dict[str, int]
    """Parameter name (every name of a tied parameter) -> the stage that holds it."""
    buffer_stages: dict[str, frozenset[int]]
    """Buffer name -> the stages that hold a copy (buffers are not trained: a buffer used
    by several stages is copied to each)."""
    canonical: dict[str, str] = field(default_factory=dict)
    """Every parameter name -> the name ``named_parameters()`` gives it (tied ones have
    several names); checkpoints are keyed by the latter."""

    def parameters(self, stage: int) -> set[str]:
        """Canonical names of the parameters ``stage`` holds."""
        return {
            name
            for name, owner in self.param_stage.items()
            if owner == stage and self.canonical.get(name, name) == name
        }

    def buffers(self, stage: int) -> set[str]:
        return {name for name, owners in self.buffer_stages.items() if stage in owners}

    def owns_module(self, module: nn.Module, name: str, stage: int) -> bool:
        """Whether ``stage`` holds every parameter of ``module``, named ``name`` in the
        model (and it has one)."""
        prefix = f"{name}." if name else ""
        names = [prefix + n for n, _ in module.named_parameters(remove_duplicate=False)]
        return bool(names) and all(self.param_stage.get(n) == stage for n in names)


def _tensor_names(model: nn.Module) -> tuple[dict[str, str], dict[int, str], dict[int, str]]:
    """(every parameter name -> canonical name, id -> canonical parameter name,
    id -> buffer name)."""
    first: dict[int, str] = {}
    canonical: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        canonical[name] = first.setdefault(id(p), name)
    buffers = {id(b): name for name, b in model.named_buffers()}
    return canonical, first, buffers


def single_stage_plan(model: nn.Module) -> StagePlan:
    """Everything on one stage."""
    canonical, _, _ = _tensor_names(model)
    return StagePlan(
        stages=1,
        parent=None,
        ranges=(),
        param_stage=dict.fromkeys(canonical, 0),
        buffer_stages={name: frozenset({0}) for name, _ in model.named_buffers()},
        canonical=canonical,
    )


class _UseRecorder(TorchFunctionMode):
    """Records, for each watched tensor, the positions in the forward where an operation
    takes it: before the blocks, in block ``i``, or after block ``i``."""

    def __init__(self, watched: dict[int, str]) -> None:
        super().__init__()
        self.watched = watched
        self.position: tuple[str, int] = ("pre", -1)
        self.uses: dict[str, set[tuple[str, int]]] = {}

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        for leaf in tree_leaves((tuple(args), dict(kwargs))):
            if isinstance(leaf, Tensor):
                name = self.watched.get(id(leaf))
                if name is not None:
                    self.uses.setdefault(name, set()).add(self.position)
        return func(*args, **kwargs)


def plan_stages(
    model: nn.Module, example: Any, split_points: Sequence[str], stages: int
) -> StagePlan:
    """Give each parameter to the stage that uses it, by running ``model(example)`` once
    (on ``meta`` tensors: the model's parameters, buffers and ``example`` all on the
    ``meta`` device, as ``build_stage`` arranges) and watching which operations take which
    tensor where: before the block stack (the first stage), in a block (the block's
    stage), after the stack (the last stage), or between two blocks (their stage; where
    two stages meet, neither runs that code, and it is refused). A parameter of a block
    belongs to the block's stage whether used or not; any other unused one to the first
    stage. A parameter two stages use is refused, naming it."""
    parent, ranges = stage_ranges(model, split_points, stages)
    blocks = dict(model.named_modules())[parent]
    assert isinstance(blocks, nn.ModuleList)
    block_stage = {i: s for s, span in enumerate(ranges) for i in span}
    canonical, param_ids, buffer_ids = _tensor_names(model)
    recorder = _UseRecorder({**param_ids, **buffer_ids})

    def stage_of(position: tuple[str, int]) -> int | None:
        kind, i = position
        if kind == "pre":
            return 0
        if kind == "block":
            return block_stage[i]
        if i == len(blocks) - 1:
            return stages - 1
        here, there = block_stage[i], block_stage[i + 1]
        return here if here == there else None

    handles = []
    for index, block in enumerate(blocks):

        def enter(module: nn.Module, args: Any, _i: int = index) -> None:
            recorder.position = ("block", _i)

        def leave(module: nn.Module, args: Any, output: Any, _i: int = index) -> None:
            recorder.position = ("after", _i)

        handles.append(block.register_forward_pre_hook(enter))
        handles.append(block.register_forward_hook(leave))
    try:
        with torch.no_grad(), recorder:
            model(example)
    except ParallelError:
        raise
    except Exception as exc:
        raise ParallelError(
            f"cannot plan the pipeline stages of {type(model).__name__}: its forward failed "
            f"on meta tensors ({exc!r}); the stages are planned by running it on the meta "
            "device, without storage"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()

    def block_of(name: str) -> int | None:
        match = re.match(rf"{re.escape(parent)}\.(\d+)\.", name)
        return block_stage[int(match.group(1))] if match else None

    def users(name: str) -> set[int]:
        found = set()
        for position in recorder.uses.get(name, ()):
            stage = stage_of(position)
            if stage is None:
                i = position[1]
                raise ParallelError(
                    f"{name!r} is used between {parent}.{i} and {parent}.{i + 1}, where "
                    f"pipeline stages {block_stage[i]} and {block_stage[i + 1]} meet: neither "
                    "stage runs the code there; move it into a block or choose other "
                    "split_points()"
                )
            found.add(stage)
        return found

    param_stage: dict[str, int] = {}
    aliases: dict[str, list[str]] = {}
    for name, main in canonical.items():
        aliases.setdefault(main, []).append(name)
    for main, names in aliases.items():
        stages_using = users(main)
        for alias in names:
            home = block_of(alias)
            if home is not None:
                stages_using.add(home)
        if len(stages_using) > 1:
            tied = [n for n in names if n != main]
            also = f" (tied to {', '.join(repr(n) for n in tied)})" if tied else ""
            raise ParallelError(
                f"parameter {main!r}{also} is used by pipeline stages "
                f"{sorted(stages_using)}: a stage holds its own parameters only, so a weight "
                "shared across a stage boundary (an embedding tied to the head, a module "
                "called before and after the blocks) cannot be split; untie it, or keep "
                "the modules that use it in one stage with split_points()"
            )
        owner = stages_using.pop() if stages_using else 0
        for alias in names:
            param_stage[alias] = owner
    buffer_stages: dict[str, frozenset[int]] = {}
    for name in buffer_ids.values():
        owners = users(name)
        home = block_of(name)
        if home is not None:
            owners.add(home)
        buffer_stages[name] = frozenset(owners or {0})
    return StagePlan(
        stages=stages,
        parent=parent,
        ranges=tuple(ranges),
        param_stage=param_stage,
        buffer_stages=buffer_stages,
        canonical=canonical,
    )


# --------------------------------------------------------------------------------------
# Building a stage: a skeleton on meta, the stage's own tensors materialised
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# The stage's forward
# --------------------------------------------------------------------------------------


def _passthrough(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


@dataclass
class _StageExit(Exception):  # noqa: N818 - control flow, not an error
    output: Tensor


class StageModule(nn.Module):
    """One pipeline stage over the model's whole module tree (see the module docstring).

    ``prefix_context()``, when given, is entered while a later stage runs what comes
    before its first block on ``meta`` (the worker turns precision handling off there).
    """

    def __init__(
        self,
        model: nn.Module,
        blocks: nn.ModuleList,
        span: range,
        *,
        last: bool,
        prefix_context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.first = span.start == 0
        self.last = last
        self.prefix_context = prefix_context
        self.template: Tensor | None = None
        """An input of the model's shape and dtype, for stages after the first: what the
        layers before the stage's blocks compute from it (on ``meta``) is replaced by the
        received activation."""
        self._received: Tensor | None = None
        self._prefix: ExitStack | None = None
        self._first_block = f"block {span.start}"
        for index, block in enumerate(blocks):
            if index not in span:
                block.forward = _passthrough
        if not self.first:
            blocks[span.start].register_forward_pre_hook(self._inject)
        if not last:
            blocks[span.stop - 1].register_forward_hook(self._exit)

    def _end_prefix(self) -> None:
        prefix, self._prefix = self._prefix, None
        if prefix is not None:
            prefix.close()

    def _inject(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        assert self._received is not None
        self._end_prefix()
        if any(isinstance(a, Tensor) and a.is_meta for a in args[1:]):
            raise ParallelError(
                f"the model passes its blocks more than the activation: a later pipeline "
                f"stage's {self._first_block} would get tensors computed before the "
                "blocks, which that stage does not run"
            )
        return (self._received, *args[1:])

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        raise _StageExit(output)

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            inputs = x
        else:
            if self.template is None:
                raise RuntimeError("a later pipeline stage needs its input template set")
            inputs = torch.empty_like(self.template, device="meta")
            self._received = x
            self._prefix = ExitStack()
            self._prefix.enter_context(torch.device("meta"))
            if self.prefix_context is not None:
                self._prefix.enter_context(self.prefix_context())
        try:
            out: Tensor = self.model(inputs)
        except _StageExit as stop:
            out = stop.output
        finally:
            self._end_prefix()
            self._received = None
        if isinstance(out, Tensor) and out.is_meta:
            raise ParallelError(
                "a pipeline stage's output was computed on meta: the model's forward uses, "
                "after the stage's blocks, something computed before them (a skip "
                "connection around the block stack) or a parameter of another stage"
            )
        return out


def apply_activation_checkpointing(blocks: nn.ModuleList) -> None:
    """Recompute each block's activations in the backward pass."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        inner: Callable[..., Any] = block.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


def replay(output: Tensor) -> nn.Module:
    """A module that returns ``output`` whatever it is called with: lets the last stage
    evaluate a task's ``loss(model, batch)`` on the output the pipeline computed."""
    return _Replay(output)


class _Replay(nn.Module):
    def __init__(self, output: Tensor) -> None:
        super().__init__()
        self.output = output

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.output
