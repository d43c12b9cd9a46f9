"""What a submitted job may train: the built-in tasks, once, or ``package.module:Name``
tasks of modules on the settings' allow-list (``task_modules``).

``BUILTIN_TASKS`` is the one table of task names: each names the ``ModelProfile`` the
Planner and the simulator use and, where the executor can train it for real, the class
that does (``trainer``, as ``module:Name``, imported only by the executor). The
executor's own tasks (``gpt-char``, ``mlp-synthetic``) get their profiles from the same
shape configs their models are built from (``GPTConfig``, ``MLPConfig``), so the two
cannot disagree. The catalog's other models are simulated only.

A task name is only ever checked against these lists here; nothing is imported for it,
and a file path is never accepted, so a request cannot make the daemon run code of its
choosing. The backend that trains jobs for real imports an allow-listed module when it
starts the job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import ModelProfile

__all__ = [
    "BUILTIN_TASKS",
    "BuiltinTask",
    "GPTConfig",
    "MLPConfig",
    "Task",
    "gpt_char_profile",
    "mlp_synthetic_profile",
    "resolve_task",
]


@dataclass(frozen=True, slots=True)
class GPTConfig:
    """Shape of ``gpt-char``'s model (``autotune.executor.tasks.GPT``): nanoGPT's layout
    with separate q/k/v/out projections, biases, pre-norm blocks and an untied head."""

    vocab: int = 256  # bytes
    context: int = 64  # bytes of context
    layers: int = 4
    width: int = 128
    heads: int = 4
    batch_size: int = 16  # global batch per step


@dataclass(frozen=True, slots=True)
class MLPConfig:
    """Shape of ``mlp-synthetic``'s model (``autotune.executor.tasks.MLPNet``): an input
    projection, ``depth`` residual blocks (LayerNorm, widen x2, GELU, narrow), a final
    LayerNorm and a classification head."""

    features: int = 32
    hidden: int = 64
    depth: int = 4
    classes: int = 10
    batch_size: int = 64  # global batch per step


def gpt_char_profile(c: GPTConfig = GPTConfig()) -> ModelProfile:
    """``gpt-char``'s profile, counted from its shape: FLOPs as 6 x parameters x tokens
    plus attention's 12 x layers x context^2 x width (PaLM appendix B); activations as
    twice Korthikanti et al.'s 34 x context x width bytes per block (their 16-bit figure,
    2022): the executor trains gpt-char in fp32 unless a precision map says otherwise."""
    per_block = (
        4 * (c.width * c.width + c.width)  # q, k, v, out projections with biases
        + 2 * c.width * 4 * c.width  # MLP weights
        + 5 * c.width  # MLP biases (4w + w)
        + 4 * c.width  # two LayerNorms
    )
    parameters = (
        c.vocab * c.width  # token embedding
        + c.context * c.width  # position embedding
        + c.layers * per_block
        + 2 * c.width  # final LayerNorm
        + c.width * c.vocab  # head, no bias
    )
    flops = 6 * parameters * c.context + 12 * c.layers * c.context**2 * c.width
    return ModelProfile(
        name="gpt-char",
        parameters=parameters,
        flops_per_sample=float(flops),
        activation_bytes_per_sample=float(34 * c.context * c.width * c.layers * 2),
        num_layers=c.layers,
        hidden_size=c.width,
        seq_len=c.context,
        reference_batch=c.batch_size,
    )


def mlp_synthetic_profile(c: MLPConfig = MLPConfig()) -> ModelProfile:
    """``mlp-synthetic``'s profile, counted from its shape: FLOPs as 6 x parameters per
    sample (one token); activations as the block's kept tensors (input, norm, widened
    pre- and post-GELU: 6 x hidden values) in 16-bit."""
    h = c.hidden
    per_block = 2 * h + (h * 2 * h + 2 * h) + (2 * h * h + h)
    parameters = (c.features * h + h) + c.depth * per_block + 2 * h + (h * c.classes + c.classes)
    return ModelProfile(
        name="mlp-synthetic",
        parameters=parameters,
        flops_per_sample=6.0 * parameters,
        activation_bytes_per_sample=float(2 * (c.features + 6 * h * c.depth + c.classes)),
        num_layers=c.depth,
        reference_batch=c.batch_size,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltinTask:
    name: str
    profile: ModelProfile
    trainer: str | None
    """The executor class that trains it for real (``module:Name``); ``None``: the task is
    a catalog model the simulator runs, with no model the executor can build."""


BUILTIN_TASKS: Final[MappingProxyType[str, BuiltinTask]] = MappingProxyType(
    {
        "gpt-char": BuiltinTask(
            name="gpt-char", profile=gpt_char_profile(), trainer="autotune.executor.tasks:GPTChar"
        ),
        "mlp-synthetic": BuiltinTask(
            name="mlp-synthetic",
            profile=mlp_synthetic_profile(),
            trainer="autotune.executor.tasks:MLPSynthetic",
        ),
        **{
            name: BuiltinTask(name=name, profile=profile, trainer=None)
            for name, profile in MODEL_CATALOG.items()
        },
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    name: str
    model: ModelProfile | None
    """``None`` for a module task: its shape is unknown until the backend loads it."""
    builtin: bool


_MODULE_TASK: Final = re.compile(
    r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):[A-Za-z_][A-Za-z0-9_]*$"
)


def resolve_task(name: str, allowed_modules: Sequence[str]) -> Task:
    """The task ``name`` stands for; ``ValueError`` saying why when it is not allowed."""
    if name in BUILTIN_TASKS:
        return Task(name=name, model=BUILTIN_TASKS[name].profile, builtin=True)
    match = _MODULE_TASK.match(name)
    if match is None:
        raise ValueError(
            f"task {name!r}: not a built-in task ({', '.join(sorted(BUILTIN_TASKS))}) "
            "nor package.module:Name"
        )
    module = match.group("module")
    if not any(
        module == allowed or module.startswith(allowed + ".") for allowed in allowed_modules
    ):
        raise ValueError(
            f"task {name!r}: module {module!r} is not on the allow-list (setting task_modules)"
        )
    return Task(name=name, model=None, builtin=False)
