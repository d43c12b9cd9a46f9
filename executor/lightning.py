"""A Lightning ``LightningModule`` as a training task:
``lightning:package.module:ClassName`` (or ``lightning:path/to/file.py:ClassName``, as
module tasks are named; the API takes the first form, its module on the allow-list).
Needs Lightning (``lightning`` or ``pytorch_lightning``: ``pip install
'autotune[lightning]'``).

The executor runs no Lightning ``Trainer``: it maps the module's hooks onto a task.

- **Model**: the class constructed with no arguments, then its ``setup("fit")`` and
  ``configure_model()`` run (Lightning's defaults do nothing). It is the model every
  layout trains: pipeline stages are cut in its largest ``nn.ModuleList`` of identical
  blocks, tensor parallelism shards its widening/narrowing ``Linear`` pairs and q/k/v/out
  projections (``stage_plan``, ``tensor_parallel``).
- **Batches**: ``train_dataloader()``, iterated endlessly (epoch after epoch), made by
  every rank on a second instance of the module whose parameters stay on ``meta``
  (``prepare_data()`` and ``setup("fit")`` run on it first), with torch's global
  generator seeded by the job's seed. A ``DataLoader`` whose sampler shuffles with no generator of
  its own gets one seeded by the job's seed (and so does the loader), so every rank draws
  the same order; any other sampler decides the order itself, and must give every rank
  the same one. The global batch is the job's batch size where it sets one, else the
  dataloader's ``batch_size``: the samples the dataloader yields are cut into batches of
  that size (across epoch boundaries, so every batch is full), and data-parallel rank
  ``r`` takes its slice of each (equal parts, along the leading dimension of every
  tensor). A batch is a tensor or a tuple, list or dict of tensors, the batch first.
- **Loss**: ``training_step(batch, batch_idx)`` (``batch_idx`` counts the calls on the
  rank, one per micro-batch), a scalar tensor or a dict with one under ``"loss"``, as
  Lightning takes it. It runs through the module's own call where data parallelism wraps
  the model (``DistributedDataParallel``: the forward is redirected to
  ``training_step`` for that call, as Lightning's strategies do). ``self.log`` and
  ``self.log_dict`` log nothing (there is no Trainer; Lightning's warning about it is
  silenced); ``self.global_step`` and ``self.current_epoch`` read 0.
- **Pipeline parallelism**: a batch is ``(inputs, targets)``; the stages run the module's
  ``forward(inputs)``, and the last stage runs ``training_step((None, targets), i)`` with
  ``self(...)`` returning the stage's output. So ``forward`` must compute what
  ``training_step`` trains, and ``training_step`` must call ``self(inputs)`` exactly
  once, with the inputs as the batch holds them, and compute the loss from its output and
  the targets alone (its ``self`` there holds no trained weights).
- **Optimizer**: ``configure_optimizers()``, called on the rank's model, may return an
  optimizer, a one-element list or tuple of one, or a dict with ``"optimizer"``; the
  task rebuilds it, the same class with the same hyper-parameters (``defaults`` and each
  parameter group's), over the rank's own parameters (under tensor or pipeline
  parallelism a subset of the module's, or shards of them; the executor's ``optimizer``
  hook, ``autotune.executor.tasks``).

Refused, each with the reason: a class that is not a ``LightningModule``, lacks
``training_step``, ``configure_optimizers`` or ``train_dataloader``, or needs
constructor arguments; manual optimization (``automatic_optimization = False``: the
executor steps the optimizer); several optimizers (GANs: that is manual optimization in
Lightning 2); learning-rate schedulers (the executor cannot rebuild one over the rank's
own parameters nor resume it from a checkpoint: return the optimizer alone);
``training_step`` returning anything but a loss (``None``, Lightning's "skip this
batch", included: every step trains); any hook that needs a ``Trainer``
(``self.trainer``); and overrides of the training-loop hooks the executor does not call
(``UNCALLED_HOOKS``: the batch-transfer, backward, optimizer-step and training
batch/epoch hooks, callbacks), which would change what trains. Validation, test,
prediction and checkpoint hooks are not training and are not called.
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, RandomSampler

from autotune.catalog.tasks import LIGHTNING_EXTRA_HINT, LIGHTNING_PREFIX, lightning_installed
from autotune.executor.stage_build import parameters_on_meta
from autotune.executor.tasks import TaskError, _import_target, _shard

__all__ = ["UNCALLED_HOOKS", "LightningTask"]

_BASES: Final = ("lightning.pytorch.core.module", "pytorch_lightning.core.module")
"""Where ``LightningModule`` is defined, in ``lightning`` and in ``pytorch_lightning``."""

_NEEDED: Final = ("training_step", "configure_optimizers", "train_dataloader")

UNCALLED_HOOKS: Final = {
    "on_fit_start": "a training-loop hook",
    "on_train_start": "a training-loop hook",
    "on_train_epoch_start": "a training-loop hook",
    "on_train_epoch_end": "a training-loop hook",
    "on_train_batch_start": "a training-loop hook",
    "on_train_batch_end": "a training-loop hook",
    "on_before_batch_transfer": "it changes the batch",
    "transfer_batch_to_device": "it changes the batch",
    "on_after_batch_transfer": "it changes the batch",
    "backward": "it changes the backward pass",
    "on_before_backward": "a backward-pass hook",
    "on_after_backward": "a backward-pass hook (it may change the gradients)",
    "configure_gradient_clipping": "it changes the gradients",
    "on_before_optimizer_step": "an optimizer-step hook (it may change the gradients)",
    "optimizer_step": "it changes the optimizer step",
    "optimizer_zero_grad": "it changes the optimizer step",
    "on_before_zero_grad": "an optimizer-step hook",
    "lr_scheduler_step": "it steps a learning-rate scheduler",
    "configure_callbacks": "callbacks run in Lightning's training loop",
}
"""Hooks Lightning's training loop calls and the executor does not: a module that
overrides one is refused, with the reason here."""

_LOG_WARNING: Final = r"You are trying to `self\.log\(\)` but the `self\.trainer` reference"


def _lightning_base(cls: type) -> type | None:
    """The ``LightningModule`` class ``cls`` derives from (``lightning``'s or
    ``pytorch_lightning``'s), found without importing either."""
    for klass in cls.__mro__:
        if klass.__name__ == "LightningModule" and klass.__module__ in _BASES:
            return klass
    return None


def _overrides(cls: type, base: type, hook: str) -> bool:
    return getattr(cls, hook, None) is not getattr(base, hook, None)


@contextmanager
def _without_trainer(spec: str, hook: str) -> Iterator[None]:
    """Runs a hook of the module; a hook that reaches for the ``Trainer`` is refused."""
    try:
        yield
    except RuntimeError as exc:
        if "is not attached to a `Trainer`" not in str(exc):
            raise
        raise TaskError(
            f"task {spec!r}: {hook} uses self.trainer, which exists under Lightning's "
            "Trainer only; the executor runs the module without one"
        ) from exc


# --------------------------------------------------------------------------------------
# Batches: tensors, or tuples, lists and dicts of them, the batch first
# --------------------------------------------------------------------------------------


def _map(batch: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it."""
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: _map(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_map(v, fn) for v in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(_map(v, fn) for v in batch)
    raise TaskError(
        f"a batch holds a {type(batch).__name__}: the task splits and joins batches along "
        "their first dimension, so a batch must be a tensor or a tuple, list or dict of "
        "tensors"
    )


def _rows(batch: Any) -> int:
    """Samples in ``batch``: the leading dimension every tensor in it shares."""
    sizes: set[int] = set()

    def note(t: Tensor) -> Tensor:
        sizes.add(int(t.shape[0]) if t.dim() else -1)
        return t

    _map(batch, note)
    if len(sizes) != 1 or -1 in sizes:
        raise TaskError(
            f"a batch's tensors have leading dimensions {sorted(sizes)}: every tensor in a "
            "batch must have the batch as its first dimension"
        )
    return sizes.pop()


def _take(batch: Any, part: slice) -> Any:
    return _map(batch, lambda t: t[part])


def _leaves(batch: Any) -> list[Tensor]:
    """The tensors in ``batch``, in order."""
    found: list[Tensor] = []

    def note(t: Tensor) -> Tensor:
        found.append(t)
        return t

    _map(batch, note)
    return found


def _join(pieces: list[Any]) -> Any:
    """The batches ``pieces`` (of one structure) as one."""
    if len(pieces) == 1:
        return pieces[0]
    columns = zip(*(_leaves(piece) for piece in pieces), strict=True)
    joined = iter([torch.cat(column) for column in columns])
    return _map(pieces[0], lambda _t: next(joined))


def _rebatch(stream: Iterator[Any], size: int) -> Iterator[Any]:
    """The samples of ``stream``'s batches, in order, in batches of ``size``."""
    pieces: list[Any] = []
    held = 0
    for batch in stream:
        pieces.append(batch)
        held += _rows(batch)
        while held >= size:
            whole = _join(pieces)
            yield _take(whole, slice(0, size)) if held > size else whole
            pieces = [_take(whole, slice(size, held))] if held > size else []
            held -= size


# --------------------------------------------------------------------------------------
# The optimizer
# --------------------------------------------------------------------------------------


def _optimizers(spec: str, conf: Any) -> tuple[list[Any], list[Any]]:
    """The optimizers and schedulers of a ``configure_optimizers()`` answer, in each of
    the forms Lightning takes."""
    if isinstance(conf, torch.optim.Optimizer):
        return [conf], []
    if isinstance(conf, Mapping):
        if "optimizer" not in conf:
            raise TaskError(
                f"task {spec!r}: configure_optimizers() returned a dict without 'optimizer'"
            )
        scheduler = conf.get("lr_scheduler")
        return [conf["optimizer"]], [] if scheduler is None else [scheduler]
    if isinstance(conf, tuple | list):
        if len(conf) == 2 and all(isinstance(c, tuple | list) for c in conf):
            return list(conf[0]), list(conf[1])  # ([optimizers], [schedulers])
        optimizers, schedulers = [], []
        for item in conf:
            found, scheduled = _optimizers(spec, item)
            optimizers += found
            schedulers += scheduled
        return optimizers, schedulers
    raise TaskError(
        f"task {spec!r}: configure_optimizers() returned {type(conf).__name__}: the executor "
        "needs an optimizer (alone, in a list or tuple, or under 'optimizer' in a dict)"
    )


def _rebuild(
    spec: str, optimizer: torch.optim.Optimizer, named: list[tuple[str, nn.Parameter]]
) -> torch.optim.Optimizer:
    """``optimizer``'s class and hyper-parameters over the parameters ``named`` only (each
    kept in its group)."""
    own = {id(p) for _, p in named}
    groups = []
    for group in optimizer.param_groups:
        keep = [i for i, p in enumerate(group["params"]) if id(p) in own]
        if not keep:
            continue
        rebuilt = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        rebuilt["params"] = [group["params"][i] for i in keep]
        if "param_names" in group:
            rebuilt["param_names"] = [group["param_names"][i] for i in keep]
        groups.append(rebuilt)
    cls = type(optimizer)
    if not groups:
        raise TaskError(
            f"task {spec!r}: this rank holds none of the parameters configure_optimizers() "
            f"gives its {cls.__name__} (a pipeline stage of frozen weights)"
        )
    accepted = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    kwargs = {k: v for k, v in optimizer.defaults.items() if takes_any or k in accepted}
    try:
        return cls(groups, **kwargs)
    except Exception as exc:
        raise TaskError(
            f"task {spec!r}: cannot rebuild its {cls.__name__} over this rank's parameters "
            f"from its defaults {sorted(optimizer.defaults)}: {exc!r}"
        ) from exc


# --------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------


class LightningTask:
    """``lightning:<module or file>:ClassName`` as a training task (see the module
    docstring); ``batch_size``: the global batch, else the dataloader's."""

    def __init__(self, spec: str, *, batch_size: int | None = None) -> None:
        target = spec.removeprefix(LIGHTNING_PREFIX)
        where, _, attr = target.rpartition(":")
        if not spec.startswith(LIGHTNING_PREFIX) or not where or not attr:
            raise TaskError(
                f"task {spec!r}: expected lightning:package.module:ClassName or "
                "lightning:path/to/file.py:ClassName"
            )
        if not lightning_installed():
            raise TaskError(f"task {spec!r} needs Lightning: {LIGHTNING_EXTRA_HINT}")
        if batch_size is not None and batch_size < 1:
            raise TaskError(f"task {spec!r}: batch size must be >= 1, not {batch_size}")
        cls = _import_target(target)
        base = _lightning_base(cls) if isinstance(cls, type) else None
        if base is None:
            what = cls.__name__ if isinstance(cls, type) else type(cls).__name__
            raise TaskError(
                f"task {spec!r}: {target} ({what}) is not a LightningModule: a lightning: "
                "task is a subclass of lightning.pytorch.LightningModule (or "
                "pytorch_lightning.LightningModule)"
            )
        missing = [hook for hook in _NEEDED if not _overrides(cls, base, hook)]
        if missing:
            raise TaskError(
                f"task {spec!r}: {cls.__name__} does not implement {', '.join(missing)}: "
                "the task's loss, optimizer and batches come from training_step, "
                "configure_optimizers and train_dataloader"
            )
        uncalled = [f"{h} ({why})" for h, why in UNCALLED_HOOKS.items() if _overrides(cls, base, h)]
        if uncalled:
            raise TaskError(
                f"task {spec!r}: {cls.__name__} overrides {', '.join(uncalled)}: the executor "
                "runs no Lightning training loop and would not call it; what it does would "
                "be silently missing"
            )
        required = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        if required:
            raise TaskError(
                f"task {spec!r}: {cls.__name__}() needs {', '.join(required)}: the executor "
                "constructs the module with no arguments; give them defaults"
            )
        self.name = spec
        self.module_class: type[nn.Module] = cls
        self._base = base
        self._requested = batch_size
        self._data: Any = None
        self._loader_batch: int | None = None
        self._loader_made = False
        self._calls = itertools.count()

    # ------------------------------------------------------------------ model

    def _construct(self) -> Any:
        try:
            return self.module_class()
        except Exception as exc:
            raise TaskError(f"task {self.name!r}: constructing it failed: {exc!r}") from exc

    def build_model(self) -> nn.Module:
        module = self._construct()
        if not module.automatic_optimization:
            raise TaskError(
                f"task {self.name!r}: {self.module_class.__name__} uses manual optimization "
                "(automatic_optimization = False): the executor computes the gradients and "
                "steps the optimizer itself, once per step, from training_step's loss"
            )
        with _without_trainer(self.name, "setup"):
            module.setup("fit")
        configure = getattr(module, "configure_model", None)  # Lightning 2.1 and later
        if callable(configure):
            with _without_trainer(self.name, "configure_model"):
                configure()
        model: nn.Module = module
        return model

    def _data_module(self) -> Any:
        """The instance the dataloader (and the pipeline's last-stage ``training_step``)
        comes from: its parameters on ``meta``, built once."""
        if self._data is None:
            with torch.random.fork_rng(devices=[]), parameters_on_meta():
                torch.manual_seed(0)
                module = self._construct()
            with _without_trainer(self.name, "prepare_data"):
                module.prepare_data()
            with _without_trainer(self.name, "setup"):
                module.setup("fit")
            self._data = module
        return self._data

    # ------------------------------------------------------------------ batches

    def _loader(self, seed: int) -> Iterable[Any]:
        module = self._data_module()
        with torch.random.fork_rng(devices=[]), _without_trainer(self.name, "train_dataloader"):
            torch.manual_seed(seed)
            loader = module.train_dataloader()
        several = isinstance(loader, Mapping) or (
            isinstance(loader, tuple | list) and any(isinstance(x, DataLoader) for x in loader)
        )
        if several or not isinstance(loader, Iterable):
            raise TaskError(
                f"task {self.name!r}: train_dataloader() returned {type(loader).__name__}: "
                "the task takes one dataloader (or one iterable of batches), not several"
            )
        if isinstance(loader, DataLoader):
            generator = torch.Generator().manual_seed(seed)
            if loader.generator is None:
                loader.generator = generator
            sampler = loader.sampler
            if isinstance(sampler, RandomSampler) and sampler.generator is None:
                sampler.generator = generator
            self._loader_batch = loader.batch_size
        self._loader_made = True
        return loader

    def _epochs(self, loader: Iterable[Any]) -> Iterator[Any]:
        while True:
            empty = True
            for batch in loader:
                empty = False
                yield batch
            if empty:
                raise TaskError(
                    f"task {self.name!r}: an epoch of train_dataloader() yielded no batch (a "
                    "dataloader is iterated once per epoch: an iterator that ends is not one)"
                )

    @property
    def batch_size(self) -> int | None:
        """The global batch: the job's, else the dataloader's ``batch_size`` (``None``
        where it has none, a batch sampler's: the executor counts each batch)."""
        if self._requested is not None:
            return self._requested
        if not self._loader_made:
            self._loader(0)
        return self._loader_batch

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._requested = value

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[Any]:
        loader = self._loader(seed)
        size = self._requested if self._requested is not None else self._loader_batch
        stream = self._epochs(loader)
        if size is not None:
            stream = _rebatch(stream, size)
        for batch in stream:
            yield _take(batch, _shard(_rows(batch), rank, world_size, shares))

    # ------------------------------------------------------------------ loss

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        index = next(self._calls)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_LOG_WARNING)
            with _without_trainer(self.name, "training_step"):
                if isinstance(model, self._base):
                    out = model.training_step(batch, index)  # type: ignore[operator]
                elif isinstance(getattr(model, "module", None), self._base):
                    out = self._through_wrapper(model, batch, index)
                else:
                    out = self._last_stage(model, batch, index)
        return self._loss_of(out)

    def _through_wrapper(self, wrapper: nn.Module, batch: Any, index: int) -> Any:
        """``training_step`` run as the wrapper's (DDP's) forward, so its hooks run."""
        module = wrapper.module
        assert isinstance(module, nn.Module)

        def step(*args: Any, **kwargs: Any) -> Any:
            del module.forward  # self(...) inside the step is the module's own forward
            return module.training_step(*args, **kwargs)  # type: ignore[operator]

        module.forward = step
        try:
            return wrapper(batch, index)
        finally:
            module.__dict__.pop("forward", None)

    def _last_stage(self, stage_output: nn.Module, batch: Any, index: int) -> Any:
        """``training_step`` on the pipeline's last stage: ``self(...)`` is ``stage_output``
        (the output the stages computed), called once."""
        module = self._data_module()
        calls = 0

        def forward(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return stage_output(*args, **kwargs)

        module.forward = forward
        try:
            with _without_trainer(self.name, "training_step"):
                out = module.training_step(batch, index)
        except TaskError:
            raise
        except Exception as exc:
            raise TaskError(
                f"task {self.name!r}: under pipeline parallelism training_step gets "
                "(None, targets) and self(inputs) returns the last stage's output; it must "
                f"pass the inputs to self(...) untouched and use nothing else of them: {exc!r}"
            ) from exc
        finally:
            del module.forward
        if calls != 1:
            raise TaskError(
                f"task {self.name!r}: training_step called self(...) {calls} times; pipeline "
                "parallelism runs the model once per batch, on its inputs"
            )
        return out

    def _loss_of(self, out: Any) -> Tensor:
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if isinstance(loss, Tensor) and loss.numel() == 1:
            return loss.reshape(())
        if out is None:
            why = "None (Lightning skips the batch then; every step of the executor trains)"
        elif isinstance(out, Mapping):
            why = f"a dict whose 'loss' is {type(loss).__name__}"
        elif isinstance(out, Tensor):
            why = f"a tensor of shape {tuple(out.shape)}"
        else:
            why = type(out).__name__
        raise TaskError(
            f"task {self.name!r}: training_step returned {why}: it must return the loss, a "
            "scalar tensor, or a dict with the loss under 'loss'"
        )

    # ------------------------------------------------------------------ optimizer

    def optimizer(
        self, model: nn.Module, parameters: list[tuple[str, nn.Parameter]]
    ) -> torch.optim.Optimizer:
        """``configure_optimizers()``'s optimizer, rebuilt over ``parameters`` (this
        rank's own)."""
        if not isinstance(model, self._base):
            raise TaskError(f"task {self.name!r}: the model is not the LightningModule")
        with _without_trainer(self.name, "configure_optimizers"):
            conf = model.configure_optimizers()  # type: ignore[operator]
        optimizers, schedulers = _optimizers(self.name, conf)
        if len(optimizers) != 1:
            raise TaskError(
                f"task {self.name!r}: configure_optimizers() gives {len(optimizers)} "
                "optimizers: the executor steps one (several need manual optimization in "
                "Lightning 2, which the executor does not run)"
            )
        if schedulers:
            names = ", ".join(type(s).__name__ for s in schedulers)
            raise TaskError(
                f"task {self.name!r}: configure_optimizers() gives a learning-rate scheduler "
                f"({names}): the executor cannot rebuild it over a rank's own parameters nor "
                "resume it from a checkpoint; return the optimizer alone"
            )
        (optimizer,) = optimizers
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TaskError(
                f"task {self.name!r}: configure_optimizers() gives a "
                f"{type(optimizer).__name__}, not a torch.optim.Optimizer"
            )
        return _rebuild(self.name, optimizer, parameters)
