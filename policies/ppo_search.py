"""Hyperparameter search for PPO with Ray Tune and ASHA.

Each trial trains PPO (``autotune.policies.ppo``) with a learning rate, an entropy
coefficient and a batch size drawn from ``SEARCH_SPACE``, all trials starting from the
same imitation warm start when one is given, and reports the mean episode return after
every iteration; ASHA stops the trials that fall behind at each rung. Bounded for a
small machine: trials run one at a time per CPU with one learner and no remote
environment runner.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Final

from autotune.policies.ppo import (
    MODULE_PATH,
    SlotPolicyModule,
    _demonstrations,
    _settings_from,
    behaviour_clone,
    build_config,
)
from autotune.policies.ppo_settings import PPOSettings
from autotune.ray_session import ensure_ray

__all__ = ["SEARCH_SPACE", "search"]

SEARCH_SPACE: Final[dict[str, tuple[Any, ...]]] = {
    "lr": ("loguniform", 3e-5, 1e-3),
    "entropy_coeff": ("uniform", 0.0, 0.01),
    "train_batch": ("choice", [256, 512]),
}
_METRIC: Final = "episode_return_mean"


def _space() -> dict[str, Any]:
    from ray import tune

    out: dict[str, Any] = {}
    for name, (kind, *args) in SEARCH_SPACE.items():
        if kind == "loguniform":
            out[name] = tune.loguniform(args[0], args[1])
        elif kind == "uniform":
            out[name] = tune.uniform(args[0], args[1])
        else:
            out[name] = tune.choice(args[0])
    return out


def _trial(config: dict[str, Any]) -> None:
    """One Tune trial: PPO with this trial's hyperparameters."""
    import torch
    from ray import tune

    torch.set_num_threads(1)
    settings = _settings_from(
        {
            **config["settings"],
            "lr": config["lr"],
            "entropy_coeff": config["entropy_coeff"],
            "train_batch": int(config["train_batch"]),
            "minibatch": min(128, int(config["train_batch"])),
        }
    )
    algo = build_config(settings).build_algo()
    if config.get("warm_start_dir"):
        algo.restore_from_path(config["warm_start_dir"], component=str(MODULE_PATH))
    try:
        for i in range(settings.iterations):
            result = algo.train()
            runners = result.get("env_runners", {})
            value = float(runners.get("episode_return_mean", math.nan))
            tune.report({_METRIC: value if math.isfinite(value) else -1e9, "iteration": i + 1})
    finally:
        algo.stop()


def _progress_callback(report: Callable[[int, int], None]) -> Any:
    """A Tune callback that calls ``report(trials_ended, iterations_run)``. Tune pickles
    its callbacks with the experiment's state (for a restore): ``report`` (a progress
    bar, with its locks) is left out of the pickle."""
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self, report: Callable[[int, int], None]) -> None:
            self.report: Callable[[int, int], None] | None = report
            self.ended = 0
            self.iterations = 0

        def __getstate__(self) -> dict[str, Any]:
            return {**self.__dict__, "report": None}

        def _tell(self) -> None:
            if self.report is not None:
                self.report(self.ended, self.iterations)

        def on_trial_result(self, *args: Any, **kwargs: Any) -> None:
            self.iterations += 1
            self._tell()

        def on_trial_complete(self, *args: Any, **kwargs: Any) -> None:
            self.ended += 1
            self._tell()

        on_trial_error = on_trial_complete

    return Progress(report)


def search(
    settings: PPOSettings,
    out: str | Path,
    *,
    samples: int = 4,
    grace: int = 2,
    concurrent: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the ASHA search; ``settings.iterations`` is each trial's most iterations.
    Returns every trial's hyperparameters, last return and iterations run, and the best.
    ``progress(trials_ended, iterations_run)`` is called as trials report and end."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # verbose=0 then means quiet
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from autotune.policies.ppo import ENV_NAME, make_train_env

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    warm_dir: str | None = None
    if settings.warm_start:
        demos = _demonstrations(settings, settings.warm_start, settings.warm_start_episodes)
        env = make_train_env(asdict(settings))
        module = SlotPolicyModule(
            observation_space=env.observation_space,
            action_space=env.action_space,
            model_config={"hidden": settings.hidden},
        )
        behaviour_clone(module, demos, epochs=settings.warm_start_epochs, seed=settings.seed)
        module.save_to_path(out / "warm_start")
        warm_dir = str(out / "warm_start")
    started_ray = ensure_ray(num_cpus=concurrent)
    try:
        from ray.tune.registry import register_env

        register_env(ENV_NAME, make_train_env)
        base = asdict(replace(settings, warm_start=None))
        tuner = tune.Tuner(
            tune.with_resources(_trial, {"cpu": 1}),
            param_space={**_space(), "settings": base, "warm_start_dir": warm_dir},
            tune_config=tune.TuneConfig(
                metric=_METRIC,
                mode="max",
                num_samples=samples,
                max_concurrent_trials=concurrent,
                scheduler=ASHAScheduler(
                    time_attr="training_iteration",
                    max_t=settings.iterations,
                    grace_period=min(grace, settings.iterations),
                    reduction_factor=2,
                ),
            ),
            run_config=tune.RunConfig(
                name="ppo_asha",
                storage_path=str(out),
                verbose=0,
                log_to_file=False,
                callbacks=[_progress_callback(progress)] if progress else None,
            ),
        )
        with contextlib.redirect_stdout(sys.stderr):  # Tune's tables: stdout is for --json
            grid = tuner.fit()
        trials = []
        for i in range(len(grid)):
            result = grid[i]
            metrics = result.metrics or {}
            drawn: dict[str, Any] = result.config or {}
            trials.append(
                {
                    "lr": drawn["lr"],
                    "entropy_coeff": drawn["entropy_coeff"],
                    "train_batch": drawn["train_batch"],
                    _METRIC: metrics.get(_METRIC),
                    "iterations": metrics.get("training_iteration"),
                    "error": str(result.error) if result.error else None,
                }
            )
        best = grid.get_best_result(metric=_METRIC, mode="max")
        best_config: dict[str, Any] = best.config or {}
    finally:
        if started_ray:
            ray.shutdown()
    return {
        "samples": samples,
        "max_iterations": settings.iterations,
        "scheduler": "ASHA",
        "trials": trials,
        "best": {
            "lr": best_config["lr"],
            "entropy_coeff": best_config["entropy_coeff"],
            "train_batch": best_config["train_batch"],
            _METRIC: (best.metrics or {}).get(_METRIC),
        },
        "time_s": time.perf_counter() - started,
    }
