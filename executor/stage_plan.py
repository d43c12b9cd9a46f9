"""Pipeline stages: where a model's stages begin and which stage holds each parameter.

Stages begin at the task's ``split_points()`` or at even cuts of the model's largest
stack of identical blocks (an ``nn.ModuleList``, as in ``nn.TransformerEncoder.layers``).

``plan_stages`` runs the model's forward once on ``meta`` inputs (the skeleton
``stage_build`` makes: no storage) and gives every parameter to the one stage that uses
it: a block's to the stage of the block, what runs before the block stack (embeddings)
to the first stage, what runs after it (final norm, head) to the last. A parameter used
by two stages (weights tied across the cut) is refused, naming it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from autotune.executor.errors import ParallelError

__all__ = [
    "StagePlan",
    "derive_split_points",
    "find_blocks",
    "plan_stages",
    "single_stage_plan",
    "stage_ranges",
]


# --------------------------------------------------------------------------------------
# Blocks and split points
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


def derive_split_points(
    model: nn.Module, stages: int, weights: Sequence[float] | None = None
) -> list[str]:
    """Names of the blocks where stages ``1..stages-1`` begin: even cuts of the stack, or,
    with ``weights`` (one per stage, e.g. its device's speed), cuts giving each stage
    blocks in those proportions (largest remainders, at least one block each)."""
    name, blocks = find_blocks(model)
    if len(blocks) < stages:
        raise ParallelError(
            f"cannot split {len(blocks)} blocks ({name}) into {stages} pipeline stages"
        )
    if weights is None:
        cuts = [round(i * len(blocks) / stages) for i in range(1, stages)]
    else:
        from autotune.executor.tasks import split_batch

        if len(weights) != stages:
            raise ParallelError(f"{stages} pipeline stages need {stages} weights, not {weights}")
        counts = split_batch(len(blocks), weights)
        cuts = list(itertools.accumulate(counts))[:-1]
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
