"""Serving the learned policy: load an RLModule checkpoint once, then compute
deterministic actions (``forward_inference``, the most likely value of each action entry)
for one decision round at a time.

- ``PolicyServer``: observation in, action out; checks at load time that the module fits
  the environment's spaces (``IncompatiblePolicyError`` otherwise).
- ``LearnedPolicy``: the daemon's ``Policy``, and the ``ppo`` row of ``autotune eval``.
  It encodes the ``ClusterSnapshot`` with the environment's encoder and decodes each
  slot's action with the environment's decoder (``autotune.envs.spaces``). When the
  checkpoint is missing or incompatible it decides with the ``rules`` policy instead,
  logs why (``policy.fallback``) and marks its choices with ``source="fallback"``.

Ray is imported (for ``RLModule.from_checkpoint``) only when a checkpoint is loaded.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from autotune import __version__
from autotune.core import DEFAULT_RESTART_S, DEFAULT_ROUND_S
from autotune.daemon.log import event
from autotune.decision.fallback import fallback_choices
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, PolicyChoice, PolicyRound
from autotune.rl.acting import (
    ActedStep,
    action_mask,
    entry_probabilities,
    logged_logp,
    split_logits,
)
from autotune.rl.action import ACTION_DIMS, decode_slot, wait_choices
from autotune.rl.observation import (
    HEADER,
    SLOT,
    ObservationEncoder,
    observation_size,
    round_slots,
)

__all__ = [
    "IncompatiblePolicyError",
    "LearnedPolicy",
    "PolicyServer",
    "checkpoint_hash",
    "default_policy_checkpoint",
]


class IncompatiblePolicyError(InputError):
    """The checkpoint is missing, unreadable or does not fit the environment."""


def default_policy_checkpoint() -> Path:
    """The policy shipped in the package (an RLModule folder)."""
    return Path(str(resources.files("autotune") / "data" / "policy"))


def checkpoint_hash(path: str | Path) -> str:
    """SHA-256 of a checkpoint folder's content (every file's relative path and bytes,
    in path order): two checkpoints with the same weights and spaces have the same hash,
    wherever they are stored."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


class PolicyServer:
    """A loaded RLModule that acts for ``slots`` job slots. ``continuous`` is the action
    it must have been trained for: the default world's (``ACTION_DIMS`` per slot), or
    one number per slot (a study's world, such as the Pollux-compatible mode's job
    weights)."""

    def __init__(
        self, checkpoint: str | Path | None = None, *, slots: int = 32, continuous: bool = False
    ) -> None:
        import torch

        from autotune.policies.ppo import SlotPolicyModule, module_dir

        # Absolute: RLlib reads a relative path as a URI.
        path = module_dir(Path(checkpoint or default_policy_checkpoint()).resolve())
        self.path = path
        self.slots = slots
        if not path.is_dir():
            raise IncompatiblePolicyError("no policy checkpoint here", path=str(path))
        try:
            from ray.rllib.core.rl_module.rl_module import RLModule

            module = RLModule.from_checkpoint(path)
        except Exception as exc:  # anything RLlib raises on a bad folder
            raise IncompatiblePolicyError(
                f"cannot load an RLModule: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                path=str(path),
            ) from None
        obs_size = observation_size(slots)
        obs_space = getattr(module, "observation_space", None)
        act_space = getattr(module, "action_space", None)
        obs_shape = tuple(getattr(obs_space, "shape", ()) or ())
        nvec = [int(n) for n in getattr(act_space, "nvec", ())]
        trained_continuous = bool(getattr(module, "continuous", False))
        if trained_continuous != continuous:
            worlds = ("the default world", "a study's world with an action number per slot")
            raise IncompatiblePolicyError(
                f"this policy was trained for {worlds[trained_continuous]}; "
                f"{worlds[continuous]} needs one trained there",
                path=str(path),
            )
        if continuous:
            ok = (
                len(obs_shape) == 1
                and obs_shape[0] > HEADER
                and (obs_shape[0] - HEADER) % len(SLOT) == 0
            )
        elif isinstance(module, SlotPolicyModule):
            # Shared across slots: any slot count, but the same per-slot layout.
            ok = (
                len(obs_shape) == 1
                and obs_shape[0] > HEADER
                and (obs_shape[0] - HEADER) % len(SLOT) == 0
                and nvec[: len(ACTION_DIMS)] == list(ACTION_DIMS)
            )
        else:
            ok = obs_shape == (obs_size,) and nvec == list(ACTION_DIMS) * slots
        if not ok:
            raise IncompatiblePolicyError(
                f"the module's spaces (observation {obs_shape}, action {nvec[:10]}...) do "
                f"not fit the environment's (observation ({obs_size},), action "
                f"{list(ACTION_DIMS)} per slot)",
                path=str(path),
            )
        if isinstance(module, SlotPolicyModule):
            missing = _missing_policy_weights(path, module)
            if missing:
                raise IncompatiblePolicyError(
                    f"the checkpoint lacks the policy's weights {missing[:3]}", path=str(path)
                )
        self.module = module
        self.continuous = continuous
        self.shared = isinstance(module, SlotPolicyModule)
        self._torch = torch

    def logits(self, observations: np.ndarray) -> np.ndarray:
        """The module's action logits, ``(N, slots * sum(ACTION_DIMS))``, for a batch of
        observations ``(N, HEADER + slots * len(SLOT))`` (any slot count for a module
        shared across slots)."""
        from ray.rllib.core.columns import Columns

        torch = self._torch
        with torch.inference_mode():
            obs = torch.from_numpy(np.asarray(observations, dtype=np.float32))
            out = self.module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        logits: np.ndarray = out.numpy().astype(np.float64)
        return logits

    def act(self, observation: np.ndarray) -> np.ndarray:
        """The deterministic action for one observation."""
        from ray.rllib.core.columns import Columns

        from autotune.policies.ppo import N_LOGITS, greedy_actions

        torch = self._torch
        with torch.inference_mode():
            obs = torch.from_numpy(np.asarray(observation, dtype=np.float32)[None, :])
            if self.continuous:  # the Gaussian's mean per slot
                module: Any = self.module  # a SlotPolicyModule
                means: np.ndarray = module.greedy(obs)[0].numpy().astype(np.float64)
                return means
            logits = self.module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
            action = greedy_actions(logits.reshape(1, -1, N_LOGITS))
        out: np.ndarray = action[0].numpy().astype(np.int64)
        return out


def _missing_policy_weights(path: Path, module: Any) -> list[str]:
    """Weights the policy acts with (encoder, logits) that the saved state lacks; RLlib
    loads a partial state without complaint."""
    import pickle

    files = sorted(path.glob("module_state.*"))
    if not files or files[0].suffix != ".pkl":
        return []  # another format: RLlib has already read it
    with files[0].open("rb") as f:
        saved = pickle.load(f)
    needed = [k for k in module.state_dict() if k.startswith(("encoder.", "logits.", "context."))]
    return [k for k in needed if k not in saved]


class LearnedPolicy:
    """The daemon's ``Policy`` backed by a ``PolicyServer``, with ``rules`` as the named
    fallback: for every job when the checkpoint cannot load, for one job when its slot
    cannot be decoded (that job alone is decided by rules, ``source="fallback"``, with
    the reason).

    It encodes the snapshot with the environment's ``ObservationEncoder`` (one per
    cluster: it remembers the demand of earlier rounds for the forecast) and decodes
    the action with the environment's decoder, so the daemon serves exactly what the
    environment trained. ``round_s`` is the decision round period
    (``autotune.daemon.settings.Settings.round_s``)."""

    name = "ppo"

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        *,
        slots: int = 32,
        round_s: float = DEFAULT_ROUND_S,
        restart_s: float = DEFAULT_RESTART_S,
        forecast: bool | str = True,
        server: PolicyServer | None = None,
        epsilon: float = 0.0,
        seed: int = 0,
        kind: str = "ppo",
        every_job: bool = False,
    ) -> None:
        """``server``: an already loaded checkpoint (``checkpoint`` is then ignored).

        ``forecast``: what fills the observation's forecast features, one of
        ``autotune.policies.forecast.FORECASTS`` (``True``: ``lstm``, ``False``:
        ``none``); the policy is trained with ``lstm``.

        ``epsilon``: the exploration floor. Each action entry of each slot takes the
        module's most likely value with probability ``1 - epsilon`` and a uniformly drawn
        one otherwise (``entry_probabilities``), so the log-probability of every logged
        action is known and never 0 or 1; 0 acts deterministically. ``seed`` seeds those
        draws. ``kind`` names the policy family in its version: ``<kind>-<first 12 hex
        digits of the checkpoint's content hash>``.

        ``restart_s``: what a reconfiguration costs where the snapshot does not say (a
        simulated cluster's charge; ``ObservationEncoder``'s).

        ``every_job``: a round with more active jobs than ``slots`` is encoded with a
        slot for each, so the policy (shared across slots) decides every job; otherwise
        the jobs beyond the slots wait in queue order."""
        from autotune.policies.rules import RulesPolicy

        if not 0.0 <= epsilon < 1.0:
            raise InputError(f"exploration epsilon {epsilon!r}: must be in [0, 1)")
        self.slots = slots
        self.every_job = every_job
        self.epsilon = float(epsilon)
        self._rng = np.random.default_rng(seed)
        self.fallback_reason: str | None = None
        self.server = server
        try:
            if self.server is None:
                self.server = PolicyServer(checkpoint, slots=slots)
        except IncompatiblePolicyError as exc:
            self.fallback_reason = str(exc)
            event("policy.fallback", level=30, policy=kind, fallback="rules", reason=str(exc))
        self.rules = RulesPolicy()
        self.kind = kind
        self.content_hash: str | None = None
        path = getattr(self.server, "path", None)
        if path is not None:
            self.content_hash = checkpoint_hash(path)
            self.version = f"{kind}-{self.content_hash[:12]}"
        elif self.server is not None:  # a server with no checkpoint folder behind it
            self.version = f"{kind}-{__version__}"
        else:
            self.version = f"{kind}-fallback-rules-{__version__}"
        from autotune.policies.forecast import demand_forecaster

        kind = forecast if isinstance(forecast, str) else "lstm" if forecast else "none"
        self.forecast_kind = kind
        forecaster = demand_forecaster(kind) if self.server is not None else None
        self.encoder = ObservationEncoder(
            slots, round_s=round_s, restart_s=restart_s, forecaster=forecaster
        )

    def _fallback(
        self, snapshot: ClusterSnapshot, why: str, job_ids: set[str] | None = None
    ) -> dict[str, PolicyChoice]:
        return fallback_choices(self.rules, snapshot, f"fallback to rules ({why})", job_ids=job_ids)

    def _act(
        self, obs: np.ndarray, active: list[Any], slots: int
    ) -> tuple[np.ndarray, ActedStep | None]:
        """The round's action: the module's most likely entries, each replaced by a
        uniform draw with probability ``epsilon``; and what the policy saw and did in
        its slots (``None`` when no job is in them)."""
        assert self.server is not None
        if self.epsilon == 0.0:
            action = self.server.act(obs)
        else:
            logits = self.server.logits(obs[None, :]).reshape(-1, sum(ACTION_DIMS))
            greedy = np.stack([p.argmax(1) for p in split_logits(logits)], axis=1)  # (slots, 7)
            explore = self._rng.random(greedy.shape) < self.epsilon
            uniform = np.floor(self._rng.random(greedy.shape) * np.array(ACTION_DIMS))
            action = np.where(explore, uniform.astype(np.int64), greedy).reshape(-1)
        acted = active[:slots]
        step: ActedStep | None = None
        if acted:
            width = len(ACTION_DIMS)
            entries = action.reshape(-1, width)[: len(acted)]
            running = np.array([j.state == "running" and j.config is not None for j in acted])
            mask = action_mask(entries, running)
            n = len(acted)
            if self.epsilon == 0.0:
                per = np.zeros(entries.shape)  # deterministic: probability 1
            else:
                slot_logits = logits[:n]
                per, _ = logged_logp(entry_probabilities(slot_logits, self.epsilon), entries, mask)
            step = ActedStep(
                observation=obs,
                job_ids=tuple(j.spec.job_id for j in acted),
                running=running,
                entries=entries.astype(np.int64),
                mask=mask,
                logp=per,
                epsilon=self.epsilon,
                policy_version=self.version,
            )
        return action, step

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        if self.server is None:
            return PolicyRound(
                choices=self._fallback(snapshot, self.fallback_reason or "no policy")
            )
        active = snapshot.queue_order()
        slots = round_slots(snapshot, self.slots, every_job=self.every_job)
        obs = self.encoder.encode(snapshot, slots=slots)
        forecast = self.encoder.forecast
        assert forecast is not None
        headroom = {
            "arrival_15": forecast.p_arrival[15],
            "arrival_60": forecast.p_arrival[60],
            "headroom": forecast.headroom(60, 0.95),
        }
        try:
            action, acted = self._act(obs, active, slots)
        except Exception as exc:  # the module itself failed: every job falls back
            why = f"the policy failed: {type(exc).__name__}: {exc}"
            event("policy.error", level=40, policy=self.version, error=why)
            return PolicyRound(choices=self._fallback(snapshot, why))
        width = len(ACTION_DIMS)
        choices: dict[str, PolicyChoice] = {}
        failed: dict[str, str] = {}
        for slot, job in enumerate(active[:slots]):
            try:
                choice = decode_slot(action[slot * width : (slot + 1) * width], job, slot)
            except ValueError as exc:  # this job's entries make no config for it
                failed[job.spec.job_id] = f"{type(exc).__name__}: {exc}"
                continue
            if choice is not None:
                choices[job.spec.job_id] = PolicyChoice(
                    config=choice.config,
                    reason=choice.reason,
                    features={**choice.features, **headroom},
                )
        choices.update(wait_choices(active, slots))
        for job_id, why in failed.items():
            event("policy.error", level=30, policy=self.version, job=job_id, error=why)
            choices.update(self._fallback(snapshot, why, {job_id}))
        return PolicyRound(choices=choices, acted=acted)
