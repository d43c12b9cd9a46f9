"""``autotune replay train``: retrain the learned policy from the daemon's logged decisions
with RLlib's offline algorithms (new API stack), optionally followed by PPO in the
simulator on the replayed workload.

Data. An export folder (``autotune replay export``): one row per job the policy acted on
in a round, ``obs`` = the cluster-wide features plus that job's slot features (54), its 7
action entries, the entries that mattered (``action_mask``) and the job's reward. The
policy is shared across slots (``SlotPolicyModule``), so a module with observation
``Box(0, 1, (54,))`` and action ``MultiDiscrete(ACTION_DIMS)`` has exactly the weights of
the served one.

Algorithms. ``bc`` (behaviour cloning) and ``marwil`` (advantage-weighted imitation,
``beta`` > 0), RLlib's ``BC`` and ``MARWIL`` reading a Parquet file prepared from the
export (``prepare``):

- Each row becomes a one-step episode in RLlib's reader, which would lose the return
  over the job's episode that MARWIL's advantages need. So ``prepare`` computes each
  row's discounted return-to-go over its ``eps_id`` (in ``t`` order, ``gamma``, scaled
  by ``reward_scale`` as PPO's rewards are), writes it as the row's reward and marks every
  row terminated: RLlib's value target (GAE with ``lambda`` 1, no bootstrap at a
  terminal step) is then exactly that Monte-Carlo return, whatever module computes it.
  The advantage is that return minus the module's value, as in MARWIL's paper. An
  episode the log cut off (``truncateds``) has its return cut there too: its last rows'
  returns are lower than the job's true ones (the shipped critic values the whole
  cluster, not one job, so it cannot bootstrap them).
- Because the value targets do not depend on the module, RLlib's mapping of the rows to
  train batches runs once and is kept in memory (``materialize_mapped_data``) for both
  algorithms, and the prepared rows are shuffled once (``seed``) so that batches mix
  rounds.
- The loss (``MaskedMARWILLearner``) counts the log-likelihood of the logged action over
  the entries that mattered only (``action_mask``: a running job that kept its
  configuration used only ``change``, a waiting job everything but ``change``); the
  other entries were drawn by the acting policy but had no effect, so they carry no
  information about what was good.
- MARWIL's critic starts fresh: the start checkpoint's critic values the whole
  cluster's reward (every slot pooled), not one job's return. BC leaves the critic as it
  was (it trains the policy only).
- One iteration is one gradient step on ``batch_size`` logged rows.

Start. The weights of ``init`` (default: the shipped policy) are loaded into the learner
before the first update; weights do not depend on the slot count, so any
``SlotPolicyModule`` checkpoint with the same width fits.

Simulator fine-tuning. ``sim_finetune`` PPO iterations (``autotune.policies.ppo``'s
``train_ppo``, one code path with ``autotune train-policy``) on windows of the export's
workload (``TraceSource(kind="replay")``: its cluster and the jobs its log saw), starting
from the offline-trained weights, with the reward the export was logged with
(``energy_weight`` from the manifest).

Output. ``out`` holds the trained RLModule at ``MODULE_PATH`` (what
``autotune.policies.ppo.module_dir`` resolves, so ``PolicyServer(out)`` loads it) and
``train.json``: the data's summary, the start checkpoint's content hash, the losses per
iteration, the simulator's returns, the time taken and the output's content hash (the
``<algo>-<first 12 hex digits>`` version the daemon will name it by).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.core import DEFAULT_ENERGY_WEIGHT
from autotune.errors import InputError
from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import HEADER, SLOT

__all__ = [
    "ALGOS",
    "MASK_COLUMN",
    "OfflineSettings",
    "ReplayData",
    "greedy_agreement",
    "load_export",
    "prepare",
    "returns_to_go",
    "train_offline",
]

ALGOS: Final = ("bc", "marwil")
OBSERVATION_SIZE: Final = HEADER + len(SLOT)
MASK_COLUMN: Final = "action_mask"
REQUIRED_COLUMNS: Final = (
    "obs",
    "new_obs",
    "actions",
    MASK_COLUMN,
    "rewards",
    "terminateds",
    "truncateds",
    "eps_id",
    "t",
)

Progress = Callable[[str, int, int, dict[str, float]], None]
"""``progress(phase, done, total, row)``: ``phase`` is ``offline`` or ``simulator``."""


@dataclass(frozen=True, slots=True)
class OfflineSettings:
    """How ``train_offline`` trains. One iteration is one gradient step on ``batch_size``
    rows; ``iterations`` ``None``: ``epochs`` passes over the data."""

    algo: str = "bc"
    iterations: int | None = None
    epochs: float = 5.0
    batch_size: int = 256
    lr: float = 1e-4
    beta: float = 1.0
    """MARWIL's advantage temperature (``bc`` uses 0)."""
    vf_coeff: float = 1.0
    gamma: float = 0.97
    """Discount of the return-to-go (PPO's)."""
    reward_scale: float = 0.1
    """Factor on the logged rewards (PPO's), so the critic keeps its scale."""
    seed: int = 0
    sim_finetune: int = 0
    """PPO iterations in the simulator after the offline training (0: none)."""
    sim_slots: int = 16
    sim_train_batch: int = 512
    sim_max_steps: int = 128
    sim_window: int = 60
    """Consecutive jobs of the replayed workload per simulated episode (at most all)."""
    sim_forecast: bool = True
    sim_teacher: str | None = None
    """A baseline (``oracle``) the module imitates on ``sim_teacher_episodes`` episodes of
    the replayed workload before PPO (``None``: PPO alone). The oracle searches the
    performance model calibrated to the logs, so this learns from the simulator, not from
    the logged actions."""
    sim_teacher_episodes: int = 20

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise InputError(f"algorithm {self.algo!r}: {' or '.join(ALGOS)}")
        if self.iterations is not None and self.iterations < 1:
            raise InputError(f"iterations {self.iterations}: must be >= 1")
        if not self.epochs > 0:
            raise InputError(f"epochs {self.epochs}: must be > 0")
        if self.batch_size < 1:
            raise InputError(f"batch size {self.batch_size}: must be >= 1")
        if not 0.0 < self.beta <= 1.0 and self.algo == "marwil":
            raise InputError(f"beta {self.beta}: MARWIL needs 0 < beta <= 1")
        if not 0.0 <= self.gamma <= 1.0:
            raise InputError(f"gamma {self.gamma}: must be in [0, 1]")
        if self.sim_finetune < 0:
            raise InputError(f"simulator iterations {self.sim_finetune}: must be >= 0")
        if self.sim_teacher is not None:
            from autotune.policies.baselines import BASELINES

            if self.sim_teacher not in BASELINES:
                raise InputError(
                    f"teacher {self.sim_teacher!r}: one of {', '.join(sorted(BASELINES))}"
                )
            if self.sim_teacher_episodes < 1:
                raise InputError(f"teacher episodes {self.sim_teacher_episodes}: must be >= 1")

    @property
    def simulates(self) -> bool:
        """Whether a simulator stage follows the offline training."""
        return bool(self.sim_finetune or self.sim_teacher)

    def offline_iterations(self, rows: int) -> int:
        """Gradient steps for ``rows`` rows of data."""
        if self.iterations is not None:
            return self.iterations
        return max(1, math.ceil(self.epochs * rows / self.batch_size))


@dataclass(frozen=True, slots=True)
class ReplayData:
    """A checked export folder."""

    path: Path
    manifest: dict[str, Any]
    files: tuple[Path, ...]
    rows: int

    @property
    def energy_weight(self) -> float:
        value = self.manifest.get("energy_weight")
        return DEFAULT_ENERGY_WEIGHT if value is None else float(value)

    def summary(self) -> dict[str, Any]:
        """What ``train.json`` records of the data."""
        keys = (
            "format",
            "rows",
            "episodes",
            "policy_versions",
            "time_range",
            "epsilon",
            "round_s",
            "energy_weight",
            "db",
        )
        return {"path": str(self.path), **{k: self.manifest.get(k) for k in keys}}


def load_export(path: str | Path) -> ReplayData:
    """Check an export folder: its manifest (format, spaces, files) and that its Parquet
    files hold the columns training reads. ``InputError`` naming what is wrong."""
    import pyarrow.parquet as pq

    from autotune.replay.export import FORMAT

    root = Path(path)
    if not root.is_dir():
        raise InputError("no such folder", path=str(root))
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise InputError(
            "no manifest.json: not an export of `autotune replay export`", path=str(root)
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable manifest: {exc}", path=str(manifest_path)) from None
    if not isinstance(manifest, dict):
        raise InputError("the manifest is not a JSON object", path=str(manifest_path))
    if manifest.get("format") != FORMAT:
        raise InputError(
            f"manifest format {manifest.get('format')!r}: expected {FORMAT!r}",
            path=str(manifest_path),
        )
    if manifest.get("observation_size") != OBSERVATION_SIZE:
        raise InputError(
            f"observation size {manifest.get('observation_size')!r}: the policy reads "
            f"{OBSERVATION_SIZE}",
            path=str(manifest_path),
        )
    if list(manifest.get("action_dims") or []) != list(ACTION_DIMS):
        raise InputError(
            f"action entries {manifest.get('action_dims')!r}: the policy acts with "
            f"{list(ACTION_DIMS)}",
            path=str(manifest_path),
        )
    names = manifest.get("files") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError("'files' is not a list of file names", path=str(manifest_path))
    files = tuple(root / n for n in names)
    for file in files:
        if not file.is_file():
            raise InputError("listed in the manifest but missing", path=str(file))
    rows = 0
    for file in files:
        try:
            meta = pq.read_metadata(file)
            schema = pq.read_schema(file)
        except Exception as exc:  # pyarrow raises several types on a bad file
            raise InputError(f"not a Parquet file: {exc}", path=str(file)) from None
        for column in REQUIRED_COLUMNS:
            if column not in schema.names:
                raise InputError("missing column", path=str(file), column=column)
        rows += meta.num_rows
    if rows == 0:
        raise InputError("the export holds no transitions", path=str(root))
    return ReplayData(path=root, manifest=manifest, files=files, rows=rows)


def returns_to_go(
    episodes: np.ndarray, steps: np.ndarray, rewards: np.ndarray, gamma: float
) -> np.ndarray:
    """Each row's discounted sum of its episode's rewards from its step on."""
    codes = np.unique(episodes, return_inverse=True)[1]
    order = np.lexsort((steps, codes))
    out = np.zeros(len(rewards), dtype=np.float64)
    future = 0.0
    previous = -1
    for i in order[::-1]:
        if codes[i] != previous:
            future = 0.0
            previous = int(codes[i])
        future = float(rewards[i]) + gamma * future
        out[i] = future
    return out


def prepare(
    data: ReplayData, out: Path, *, gamma: float, reward_scale: float, seed: int
) -> dict[str, float]:
    """Write the rows RLlib trains on to the Parquet file ``out`` (see the module
    docstring): the export's observations, actions and masks, the scaled discounted
    return-to-go as the reward, every row terminated, rows shuffled. The mask travels as
    an extra column: RLlib's reader hands the columns it does not know to the train batch
    (as extra model outputs of each one-step episode). Returns statistics of the
    returns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, columns=list(REQUIRED_COLUMNS)) for f in data.files]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    rewards = table.column("rewards").to_numpy().astype(np.float64)
    if not np.all(np.isfinite(rewards)):
        raise InputError("non-finite rewards", path=str(data.path), column="rewards")
    returns = reward_scale * returns_to_go(
        table.column("eps_id").to_numpy(zero_copy_only=False),
        table.column("t").to_numpy(),
        rewards,
        gamma,
    )
    n = table.num_rows
    prepared = pa.table(
        {
            "obs": table.column("obs"),
            "new_obs": table.column("new_obs"),
            "actions": table.column("actions"),
            MASK_COLUMN: table.column(MASK_COLUMN),
            "rewards": pa.array(returns, pa.float64()),
            "terminateds": pa.array(np.ones(n, dtype=bool)),
            "truncateds": pa.array(np.zeros(n, dtype=bool)),
        }
    )
    order = np.random.default_rng(seed).permutation(n)
    pq.write_table(prepared.take(pa.array(order)), out)
    return {
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_max": float(returns.max()),
    }


def greedy_agreement(server: Any, data: ReplayData) -> float:
    """Share of the logged entries that mattered (``action_mask``) that the module's most
    likely value equals; ``server`` is a ``PolicyServer``."""
    import pyarrow.parquet as pq

    agree = 0
    total = 0
    bounds = np.cumsum((0, *ACTION_DIMS))
    for file in data.files:
        table = pq.read_table(file, columns=["obs", "actions", MASK_COLUMN])
        obs = _fixed(table.column("obs"), OBSERVATION_SIZE, np.float32)
        actions = _fixed(table.column("actions"), len(ACTION_DIMS), np.int64)
        mask = _fixed(table.column(MASK_COLUMN), len(ACTION_DIMS), np.bool_)
        logits = server.logits(obs)
        greedy = np.stack(
            [logits[:, bounds[d] : bounds[d + 1]].argmax(1) for d in range(len(ACTION_DIMS))],
            axis=1,
        )
        agree += int(((greedy == actions) & mask).sum())
        total += int(mask.sum())
    return agree / total if total else math.nan


def _fixed(column: Any, width: int, dtype: Any) -> np.ndarray:
    """A fixed-size-list Arrow column as an ``(N, width)`` array."""
    import pyarrow as pa

    flat = pa.concat_arrays([chunk.flatten() for chunk in column.chunks])
    values: np.ndarray = flat.to_numpy(zero_copy_only=False).astype(dtype)
    return values.reshape(-1, width)


@dataclass(frozen=True, slots=True)
class _Start:
    """The checkpoint training starts from."""

    path: Path
    content_hash: str
    hidden: int
    weights: dict[str, Any]


def _start(init: str | Path | None) -> _Start:
    """Load and check the start checkpoint (default: the shipped policy): it must be a
    ``SlotPolicyModule`` that serving accepts. ``InputError`` otherwise."""
    from autotune.policies.ppo import SlotPolicyModule
    from autotune.policies.serving import PolicyServer, checkpoint_hash, default_policy_checkpoint

    server = PolicyServer(init or default_policy_checkpoint(), slots=1)
    if not isinstance(server.module, SlotPolicyModule):
        raise InputError(
            "not a policy shared across job slots (SlotPolicyModule)", path=str(server.path)
        )
    config: Any = server.module.model_config or {}
    return _Start(
        path=server.path,
        content_hash=checkpoint_hash(server.path),
        hidden=int(config.get("hidden", 64)),
        weights=server.module.get_state(),
    )


def _spaces() -> tuple[Any, Any]:
    """One job slot's observation and action spaces."""
    import gymnasium as gym

    observation = gym.spaces.Box(0.0, 1.0, (OBSERVATION_SIZE,), np.float32)
    return observation, gym.spaces.MultiDiscrete(list(ACTION_DIMS))


def _algorithm_config(settings: OfflineSettings, prepared: Path, hidden: int) -> Any:
    """RLlib's BC or MARWIL configuration reading ``prepared``: one local learner, the
    reader and its mapping on one CPU each (more only queue on a small machine), the rows
    mapped once and kept in memory."""
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.algorithms.marwil import MARWILConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from autotune.policies.ppo import SlotPolicyModule
    from autotune.policies.replay.learner import MaskedMARWILLearner

    observation, action = _spaces()
    training: dict[str, Any] = {
        "lr": settings.lr,
        "train_batch_size_per_learner": settings.batch_size,
    }
    config: Any
    if settings.algo == "bc":
        config = BCConfig()  # type: ignore[no-untyped-call]
    else:
        config = MARWILConfig()  # type: ignore[no-untyped-call]
        # MARWIL adds a bootstrap step (masked out of the loss) after every one-step
        # episode, and RLlib counts batches in steps: twice the steps per logged row.
        training.update(
            train_batch_size_per_learner=2 * settings.batch_size,
            beta=settings.beta,
            vf_coeff=settings.vf_coeff,
            gamma=settings.gamma,
        )
        # MARWIL's value targets: GAE with lambda 1 (its default), the Monte-Carlo return.
        config.lambda_ = 1.0
    return (
        config.environment(observation_space=observation, action_space=action)
        .framework("torch")
        .learners(num_learners=0, learner_class=MaskedMARWILLearner)
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=SlotPolicyModule, model_config={"hidden": hidden}
            )
        )
        .training(**training)
        .offline_data(
            input_=[str(prepared)],
            input_read_method_kwargs={"override_num_blocks": 1},
            map_batches_kwargs={"concurrency": 1, "num_cpus": 1},
            materialize_data=False,
            materialize_mapped_data=True,
            dataset_num_iters_per_learner=1,
        )
        .debugging(seed=settings.seed, log_level="ERROR")
    )


@contextmanager
def _quiet_ray_data() -> Iterator[None]:
    """No progress logs from Ray Data's executor while training (the CLI draws its own
    bar); the settings are restored afterwards."""
    import ray.data

    context = ray.data.DataContext.get_current()
    flags = {"enable_progress_bars": False, "print_on_execution_start": False}
    saved_flags = {name: getattr(context, name) for name in flags}
    loggers = [logging.getLogger(name) for name in ("ray.data", "ray.rllib", "ray.tune")]
    saved_levels = [logger.level for logger in loggers]
    for name, value in flags.items():
        setattr(context, name, value)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, value in saved_flags.items():
            setattr(context, name, value)
        for logger, level in zip(loggers, saved_levels, strict=True):
            logger.setLevel(level)


CRITIC_PREFIXES: Final = ("value_encoder.", "value.")


def _fresh_critic(weights: dict[str, Any], hidden: int, seed: int) -> dict[str, Any]:
    """``weights`` with the critic's replaced by a freshly initialised one. The start
    checkpoint's critic values the whole cluster's discounted reward (PPO's, every slot
    pooled); MARWIL's critic values one job's return, a different quantity (the shipped
    critic predicts about 150 where a job's scaled return is about 3, which would
    weight every logged action by ``exp(-15)``)."""
    import torch

    from autotune.policies.ppo import SlotPolicyModule

    observation, action = _spaces()
    torch.manual_seed(seed)
    fresh = SlotPolicyModule(
        observation_space=observation, action_space=action, model_config={"hidden": hidden}
    ).get_state()
    return {k: fresh[k] if k.startswith(CRITIC_PREFIXES) else v for k, v in weights.items()}


def _save_module(weights: dict[str, Any], hidden: int, out: Path) -> None:
    """A one-slot ``SlotPolicyModule`` with ``weights``, saved as an RLModule checkpoint
    at ``out`` (replaced if there)."""
    from autotune.policies.ppo import SlotPolicyModule

    observation, action = _spaces()
    module = SlotPolicyModule(
        observation_space=observation, action_space=action, model_config={"hidden": hidden}
    )
    module.set_state(weights)
    if out.exists():
        shutil.rmtree(out)
    module.save_to_path(out)


def _loss_row(i: int, result: dict[str, Any], started: float) -> dict[str, float]:
    learner = result.get("learners", {}).get("default_policy", {})
    row = {"iteration": float(i), "time_s": time.perf_counter() - started}
    for key in ("total_loss", "policy_loss", "vf_loss", "vf_explained_var"):
        if key in learner:
            row[key] = float(learner[key])
    return row


def _offline(
    settings: OfflineSettings,
    prepared: Path,
    start: _Start,
    iterations: int,
    out_module: Path,
    progress: Progress | None,
) -> list[dict[str, float]]:
    """Run the offline algorithm from the start weights; save the learner's module at
    ``out_module``. Returns the losses per iteration."""
    started = time.perf_counter()
    algo = _algorithm_config(settings, prepared, start.hidden).build_algo()
    history: list[dict[str, float]] = []
    try:
        weights = start.weights
        if settings.algo == "marwil":
            weights = _fresh_critic(weights, start.hidden, settings.seed)
        algo.learner_group.set_weights({"default_policy": weights})
        for i in range(1, iterations + 1):
            row = _loss_row(i, algo.train(), started)
            history.append(row)
            if progress is not None:
                progress("offline", i, iterations, row)
        weights = algo.learner_group.get_weights()["default_policy"]
        _save_module(weights, start.hidden, out_module)
    finally:
        # The batch iterator holds Ray Data's executor; release it while Ray is up.
        offline_data = getattr(algo, "offline_data", None)
        if offline_data is not None:
            offline_data.batch_iterators = None
        algo.stop()
    return history


def _finetune(
    settings: OfflineSettings,
    data: ReplayData,
    module: Path,
    hidden: int,
    work: Path,
    progress: Progress | None,
) -> dict[str, Any]:
    """``settings.sim_finetune`` PPO iterations on the export's workload from the weights
    at ``module``; the result replaces ``module``. Returns PPO's report, trimmed."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    from autotune.envs.workloads import load_workload
    from autotune.policies.ppo import train_ppo
    from autotune.policies.ppo_settings import PPOSettings, TraceSource

    _, arrivals, round_s = load_workload(data.path)
    if not arrivals:
        raise InputError("the workload has no jobs to simulate", path=str(data.path))
    window = min(settings.sim_window, len(arrivals))
    ppo = PPOSettings(
        iterations=settings.sim_finetune,
        checkpoint_every=settings.sim_finetune + 1,
        slots=settings.sim_slots,
        round_s=round_s,
        max_steps=settings.sim_max_steps,
        forecast=settings.sim_forecast,
        train_batch=settings.sim_train_batch,
        minibatch=min(128, settings.sim_train_batch),
        gamma=settings.gamma,
        hidden=hidden,
        reward_scale=settings.reward_scale,
        energy_weight=data.energy_weight,
        warm_start=settings.sim_teacher,
        warm_start_episodes=settings.sim_teacher_episodes,
        init_module=str(module),
        seed=settings.seed,
        sources=(TraceSource(kind="replay", jobs=str(data.path), window=window, round_s=round_s),),
    )

    def update(i: int, n: int, row: dict[str, float]) -> None:
        if progress is not None:
            progress("simulator", i, n, row)

    report = train_ppo(ppo, work, progress=update)
    weights = RLModule.from_checkpoint(report["module"]).get_state()
    _save_module(weights, hidden, module)
    return {
        "iterations": settings.sim_finetune,
        "teacher": report.get("warm_start"),
        "window": window,
        "jobs": len(arrivals),
        "round_s": round_s,
        "energy_weight": data.energy_weight,
        "history": report["history"],
        "time_s": report["time_s"],
    }


def train_offline(
    data_dir: str | Path,
    out: str | Path,
    settings: OfflineSettings,
    *,
    init: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train a policy from an export folder (see the module docstring) and write it to
    ``out`` (``MODULE_PATH`` and ``train.json``). Returns what ``train.json`` holds.

    Bad input (the folder, its manifest or files, the start checkpoint, the workload
    when fine-tuning) raises ``InputError`` before any training starts."""
    import ray

    from autotune.policies.ppo import MODULE_PATH
    from autotune.policies.serving import PolicyServer, checkpoint_hash
    from autotune.ray_session import ensure_ray

    began = time.perf_counter()
    data = load_export(data_dir)
    start = _start(init)
    if settings.simulates:
        from autotune.envs.workloads import load_workload

        load_workload(data.path)  # checked now, not after the offline training
    out = Path(out).resolve()  # RLlib reads a relative path as a URI
    out_module = out / MODULE_PATH
    iterations = settings.offline_iterations(data.rows)
    seconds: dict[str, float] = {}
    report: dict[str, Any] = {
        "algo": settings.algo,
        "data": data.summary(),
        "init": {"path": str(start.path), "hash": start.content_hash},
        "settings": asdict(settings),
        "iterations": iterations,
    }
    with tempfile.TemporaryDirectory(prefix="autotune-replay-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        prepared = work / "prepared.parquet"
        report["returns"] = prepare(
            data,
            prepared,
            gamma=settings.gamma,
            reward_scale=settings.reward_scale,
            seed=settings.seed,
        )
        seconds["prepare"] = time.perf_counter() - t0
        out.mkdir(parents=True, exist_ok=True)
        # Started away from the working directory, whose autotune/ (a source checkout)
        # would shadow the installed package in Ray's workers.
        started_ray = ensure_ray(num_cpus=2)
        try:
            t0 = time.perf_counter()
            with _quiet_ray_data():
                report["history"] = _offline(
                    settings, prepared, start, iterations, out_module, progress
                )
            seconds["offline"] = time.perf_counter() - t0
            report["agreement"] = {
                "init": greedy_agreement(PolicyServer(start.path, slots=1), data),
                "offline": greedy_agreement(PolicyServer(out, slots=1), data),
            }
            report["sim_finetune"] = None
            if settings.simulates:
                t0 = time.perf_counter()
                report["sim_finetune"] = _finetune(
                    settings, data, out_module, start.hidden, work / "ppo", progress
                )
                seconds["sim_finetune"] = time.perf_counter() - t0
                report["agreement"]["final"] = greedy_agreement(PolicyServer(out, slots=1), data)
        finally:
            if started_ray and ray.is_initialized():
                ray.shutdown()
    content_hash = checkpoint_hash(out_module)
    seconds["total"] = time.perf_counter() - began
    report["seconds"] = seconds
    report["checkpoint"] = str(out_module)
    report["hash"] = content_hash
    report["version"] = f"{settings.algo}-{content_hash[:12]}"
    (out / "train.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report
