"""What a submitted job may train: the built-in tasks, once, or ``package.module:Name``
tasks of modules on the settings' allow-list (``task_modules``).

``BUILTIN_TASKS`` is the one table of task names: each names the ``ModelProfile`` the
Planner and the simulator use and, where the executor can train it for real, the class
that does (``trainer``, as ``module:Name``, imported only by the executor) and the shape
config it builds its model from (``shape``). A profile is counted from the same config
(``autotune.catalog.profiles``), so the two cannot disagree.

Trained for real (``--backend ray``, ``autotune job run``): ``gpt-char``,
``mlp-synthetic``, ``resnet-mini``, ``ctr-synthetic``, ``gpt-125m``, ``gpt-350m``,
``gpt-1.3b``, ``bert-large``, ``resnet-50``, ``resnet-152``. Simulated only, with the
reason in ``simulated_only``: ``gpt-7b`` to ``gpt-70b`` and the six Pollux applications.
A backend that trains for real refuses those at submission (``resolve_task(...,
trains=True)``).

Hugging Face models are ``hf:<architecture>[-<size>]`` (``autotune.catalog.hf``): a
backend trains them where the ``hf`` extra is installed, and their profile is counted
from their configuration there, as the built-in ones' are from their shapes.

A ``LightningModule`` is ``lightning:package.module:ClassName`` (``LIGHTNING_PREFIX``),
its module allow-listed as a module task's is (``autotune.executor.lightning`` trains
it; Lightning must be installed: ``LIGHTNING_EXTRA_HINT``).

A task name is only ever checked against these lists here; nothing is imported for it,
and a file path is never accepted, so a request cannot make the daemon run code of its
choosing. The backend that trains jobs for real imports an allow-listed module when it
starts the job.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from autotune.catalog.applications import APPLICATIONS
from autotune.catalog.hf import EXTRA_HINT, HF_PREFIX, hf_installed, hf_profile
from autotune.catalog.profiles import (
    MODEL_CATALOG,
    MODEL_SHAPES,
    BERTConfig,
    GPTConfig,
    ModelShape,
    ResNetConfig,
    gpt_profile,
    resnet_profile,
)
from autotune.core import ModelProfile

__all__ = [
    "BUILTIN_TASKS",
    "FULL_INIT_MAX_BYTES",
    "LIGHTNING_EXTRA_HINT",
    "LIGHTNING_PREFIX",
    "RESNET_MINI",
    "BERTConfig",
    "BuiltinTask",
    "CTRConfig",
    "GPTConfig",
    "MLPConfig",
    "ResNetConfig",
    "Task",
    "ctr_synthetic_profile",
    "gpt_char_profile",
    "lightning_installed",
    "measured_compression_efficiency",
    "measured_noise_scale",
    "mlp_synthetic_profile",
    "register_compression_efficiency",
    "register_noise_scale",
    "resolve_task",
    "task_profile",
    "trainable_tasks",
]

FULL_INIT_MAX_BYTES: Final = int(os.environ.get("AUTOTUNE_FULL_INIT_MAX_BYTES", 8 << 30))
"""Largest model (bytes of fp32 parameters) the executor builds whole on one rank, to
give a stage the full model's initial weights bit for bit (``autotune.executor.
stage_build``); a backend that trains refuses a larger Hugging Face model."""


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


def gpt_char_profile(c: GPTConfig | None = None) -> ModelProfile:
    """``gpt-char``'s profile (default: its shape, ``GPTConfig()``), counted as every
    GPT's is (``autotune.catalog.profiles.gpt_profile``)."""
    return gpt_profile("gpt-char", c or GPTConfig())


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


# The gradient noise scales (samples) of the small built-in tasks, as the executor's
# estimator measured them (``autotune.executor.quality``; dp=2, 60 steps from the start,
# uncompressed, fp32: ``python bench/quality_overhead.py --task resnet-mini:64 --task
# ctr-synthetic:512 --compression none --steps 60 --repeats 1``: 399.9 and 260.5). A job
# that trains measures its own, which replaces these.
RESNET_MINI_NOISE_SCALE: Final = 400.0
CTR_NOISE_SCALE: Final = 260.0


@dataclass(frozen=True, slots=True)
class CTRConfig:
    """Shape of ``ctr-synthetic``'s model (``autotune.executor.tasks.CTRNet``), a
    click-through-rate model in DLRM's shape: one embedding table holding ``fields``
    categorical fields of ``categories`` rows each, ``dim`` wide, their rows concatenated
    into a ``hidden``-wide ReLU layer and a logit."""

    fields: int = 8
    categories: int = 4096
    dim: int = 16
    hidden: int = 64
    batch_size: int = 512  # global batch per step
    learning_rate: float = 1e-3  # Adam's, constant


def ctr_synthetic_profile(c: CTRConfig = CTRConfig()) -> ModelProfile:
    """``ctr-synthetic``'s profile, counted from its shape. Nearly all its parameters are
    embedding rows, of which a sample reads ``fields``: FLOPs are 6 x the dense layers'
    parameters plus the rows read, per sample; activations the rows read, the hidden
    layer before and after its ReLU and the logit, in 16-bit."""
    dense = (c.fields * c.dim * c.hidden + c.hidden) + (c.hidden + 1)
    return ModelProfile(
        name="ctr-synthetic",
        parameters=c.fields * c.categories * c.dim + dense,
        flops_per_sample=6.0 * (dense + c.fields * c.dim),
        activation_bytes_per_sample=float(2 * (c.fields * c.dim + 2 * c.hidden + 1)),
        num_layers=1,
        reference_batch=c.batch_size,
        noise_scale=CTR_NOISE_SCALE,
    )


RESNET_MINI: Final = ResNetConfig(
    blocks=(1, 1, 1, 1), width=16, classes=10, image=32, batch_size=64, learning_rate=1e-3
)
"""``resnet-mini``'s shape: the bottleneck ResNet of ``resnet-50`` at the scale of a
CIFAR image (32 pixels a side, 10 classes), one block per stage and a quarter of the
width: 511,514 parameters, 2 MB of fp32 gradients a step against ~20 ms of compute
per 64 images on one CPU core, so that on a network a dense step is mostly
synchronisation, as ``gpt-char``'s is."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltinTask:
    name: str
    profile: ModelProfile
    trainer: str | None
    """The executor class that trains it for real (``module:Name``, constructed with
    ``config=shape`` when ``shape`` is set); ``None``: simulated only."""
    shape: ModelShape | MLPConfig | CTRConfig | None = None
    """The config the trainer builds its model from, and the profile is counted from."""
    simulated_only: str | None = None
    """Why the executor cannot train it (set exactly when ``trainer`` is ``None``)."""

    def __post_init__(self) -> None:
        if (self.trainer is None) != (self.simulated_only is not None):
            raise ValueError(f"task {self.name!r}: a trainer or a reason it has none, not both")


_EXECUTOR: Final = "autotune.executor.tasks"
_TRAINERS: Final = {
    GPTConfig: "GPTBytes",
    BERTConfig: "BERTMasked",
    ResNetConfig: "ResNetSynthetic",
}
_TRAINED_SHAPES: Final = (
    "gpt-125m",
    "gpt-350m",
    "gpt-1.3b",
    "bert-large",
    "resnet-50",
    "resnet-152",
)


def _simulated_only(name: str, profile: ModelProfile) -> str:
    if name in APPLICATIONS:
        alias = (
            " (imagenet is ResNet-50: submit resnet-50 to train that)" if name == "imagenet" else ""
        )
        return (
            "a Pollux application, whose profile and coefficients come from Pollux's "
            f"published measurements, not from a model the executor builds{alias}"
        )
    return (
        "every rank of the executor holds its whole pipeline stage in fp32 (the whole model "
        "without pipelining) before tensor parallelism splits it, more than the Planner's "
        f"memory model counts ({4 * profile.parameters / 1e9:.0f} GB of weights for {name}); "
        "the largest catalog GPT it trains is gpt-1.3b"
    )


def _catalog_task(name: str, profile: ModelProfile) -> BuiltinTask:
    shape = MODEL_SHAPES.get(name)
    if shape is not None and name in _TRAINED_SHAPES:
        return BuiltinTask(
            name=name,
            profile=profile,
            trainer=f"{_EXECUTOR}:{_TRAINERS[type(shape)]}",
            shape=shape,
        )
    return BuiltinTask(
        name=name, profile=profile, trainer=None, simulated_only=_simulated_only(name, profile)
    )


BUILTIN_TASKS: Final[MappingProxyType[str, BuiltinTask]] = MappingProxyType(
    {
        "gpt-char": BuiltinTask(
            name="gpt-char",
            profile=gpt_char_profile(),
            trainer=f"{_EXECUTOR}:GPTChar",
            shape=GPTConfig(),
        ),
        "mlp-synthetic": BuiltinTask(
            name="mlp-synthetic",
            profile=mlp_synthetic_profile(),
            trainer=f"{_EXECUTOR}:MLPSynthetic",
            shape=MLPConfig(),
        ),
        "resnet-mini": BuiltinTask(
            name="resnet-mini",
            profile=resnet_profile("resnet-mini", RESNET_MINI, noise_scale=RESNET_MINI_NOISE_SCALE),
            trainer=f"{_EXECUTOR}:ResNetSynthetic",
            shape=RESNET_MINI,
        ),
        "ctr-synthetic": BuiltinTask(
            name="ctr-synthetic",
            profile=ctr_synthetic_profile(),
            trainer=f"{_EXECUTOR}:CTRSynthetic",
            shape=CTRConfig(),
        ),
        **{name: _catalog_task(name, profile) for name, profile in MODEL_CATALOG.items()},
    }
)


_MEASURED_NOISE: dict[str, float] = {}
"""Gradient noise scales a cluster's calibration measured, by built-in task name."""


def register_noise_scale(task: str, noise_scale: float) -> None:
    """The gradient noise scale (samples) a calibration measured of built-in ``task``
    (``autotune calibrate --cluster-file``; ``autotune.catalog.clusters.
    register_calibration``): from then on the task's profile (``task_profile``) starts from
    it instead of the catalog's, in the simulated cluster a policy trains in and in the
    daemon that serves it, until the job measures its own (``JobMetrics.noise_scale``)."""
    if task not in BUILTIN_TASKS:
        raise ValueError(f"task {task!r}: not a built-in task")
    if not noise_scale > 0:
        raise ValueError(f"task {task!r}: a noise scale must be positive, not {noise_scale!r}")
    _MEASURED_NOISE[task] = float(noise_scale)


def measured_noise_scale(task: str) -> float | None:
    """The noise scale a calibration measured of built-in ``task``, if one did."""
    return _MEASURED_NOISE.get(task)


_MEASURED_COMPRESSION: dict[str, dict[str, float]] = {}
"""Compression efficiencies a cluster's calibration measured, by built-in task name."""


def register_compression_efficiency(task: str, efficiencies: Mapping[str, float]) -> None:
    """The statistical efficiency under each compression (by its text form,
    ``str(CompressionSpec)``) a calibration measured of built-in ``task`` (``autotune
    calibrate --efficiency``; ``autotune.executor.efficiency``): from then on the task's
    profile (``task_profile``) is charged these instead of the catalog's constants, in the
    simulated cluster a policy trains in and in the daemon that serves it."""
    if task not in BUILTIN_TASKS:
        raise ValueError(f"task {task!r}: not a built-in task")
    checked = BUILTIN_TASKS[task].profile.with_compression_efficiency(efficiencies)
    _MEASURED_COMPRESSION[task] = dict(checked.compression_efficiency)


def measured_compression_efficiency(task: str) -> dict[str, float]:
    """The compression efficiencies a calibration measured of built-in ``task``."""
    return dict(_MEASURED_COMPRESSION.get(task, {}))


def task_profile(name: str) -> ModelProfile:
    """Built-in task ``name``'s profile: the catalog's, with the noise scale and the
    compression efficiencies a calibration measured of it where one did
    (``register_noise_scale``, ``register_compression_efficiency``)."""
    profile = BUILTIN_TASKS[name].profile
    return profile.with_noise_scale(_MEASURED_NOISE.get(name)).with_compression_efficiency(
        _MEASURED_COMPRESSION.get(name)
    )


def trainable_tasks() -> list[str]:
    """The built-in tasks the executor trains for real, in table order."""
    return [name for name, task in BUILTIN_TASKS.items() if task.trainer is not None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    name: str
    model: ModelProfile | None
    """``None`` for a module task: its shape is unknown until the backend loads it."""
    builtin: bool


_MODULE_TASK: Final = re.compile(
    r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):[A-Za-z_][A-Za-z0-9_]*$"
)

LIGHTNING_PREFIX: Final = "lightning:"
"""``lightning:package.module:ClassName``: a ``LightningModule`` trained as a task
(``autotune.executor.lightning``)."""
LIGHTNING_EXTRA_HINT: Final = "pip install 'autotune[lightning]'"
_LIGHTNING_PACKAGES: Final = ("lightning", "pytorch_lightning")


def lightning_installed() -> bool:
    """Whether Lightning (``lightning`` or ``pytorch_lightning``) can be imported here,
    found without importing it."""
    return any(importlib.util.find_spec(name) is not None for name in _LIGHTNING_PACKAGES)


def _check_allowed(name: str, module: str, allowed_modules: Sequence[str]) -> None:
    if not any(
        module == allowed or module.startswith(allowed + ".") for allowed in allowed_modules
    ):
        raise ValueError(
            f"task {name!r}: module {module!r} is not on the allow-list (setting task_modules)"
        )


def _lightning_task(name: str, allowed_modules: Sequence[str]) -> Task:
    """``lightning:package.module:ClassName``, its module allow-listed as a module task's
    is; Lightning must be installed where the daemon runs."""
    match = _MODULE_TASK.match(name.removeprefix(LIGHTNING_PREFIX))
    if match is None:
        raise ValueError(f"task {name!r}: expected lightning:package.module:ClassName")
    _check_allowed(name, match.group("module"), allowed_modules)
    if not lightning_installed():
        raise ValueError(f"task {name!r} needs Lightning: {LIGHTNING_EXTRA_HINT}")
    return Task(name=name, model=None, builtin=False)


def _hf_profile(name: str, *, trains: bool) -> ModelProfile:
    """The profile of a Hugging Face task (``autotune.catalog.hf``); refused where the
    ``hf`` extra is missing, and, for a backend that trains (``trains``), where a rank
    could not build its stage as the executor does, the whole model in fp32 before tensor
    parallelism splits it, within ``FULL_INIT_MAX_BYTES``."""
    profile = hf_profile(name)  # a name that is not one is refused first
    if not hf_installed():
        raise ValueError(f"task {name!r} needs Hugging Face transformers: {EXTRA_HINT}")
    if trains and 4 * profile.parameters > FULL_INIT_MAX_BYTES:
        raise ValueError(
            f"task {name!r} is simulated only: every rank of the executor holds its whole "
            f"pipeline stage in fp32 (the whole model without pipelining) before tensor "
            f"parallelism splits it, {4 * profile.parameters / 2**30:.0f} GiB of weights, "
            f"above the {FULL_INIT_MAX_BYTES / 2**30:.0f} GiB a rank builds whole"
        )
    return profile


def resolve_task(name: str, allowed_modules: Sequence[str], *, trains: bool = False) -> Task:
    """The task ``name`` stands for; ``ValueError`` saying why when it is not allowed.

    ``trains``: the backend trains jobs for real (``--backend ray``), so a built-in task
    with no trainer is refused; a simulated backend takes every built-in task."""
    if name.startswith(HF_PREFIX):
        return Task(name=name, model=_hf_profile(name, trains=trains), builtin=True)
    builtin = BUILTIN_TASKS.get(name)
    if builtin is not None:
        if trains and builtin.simulated_only is not None:
            raise ValueError(
                f"task {name!r} is simulated only: {builtin.simulated_only}. Tasks this "
                f"backend trains: {', '.join(trainable_tasks())}"
            )
        return Task(name=name, model=task_profile(name), builtin=True)
    if name.startswith(LIGHTNING_PREFIX):
        return _lightning_task(name, allowed_modules)
    match = _MODULE_TASK.match(name)
    if match is None:
        raise ValueError(
            f"task {name!r}: not a built-in task ({', '.join(sorted(BUILTIN_TASKS))}) "
            "nor package.module:Name"
        )
    _check_allowed(name, match.group("module"), allowed_modules)
    return Task(name=name, model=None, builtin=False)
