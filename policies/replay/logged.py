"""What the daemon logged of its learned policy's decisions, as the off-policy estimates
read it (``autotune.policies.replay.ope``): one row per job decision in a round, with its
episode (one job's life), the action entries taken, which of them mattered, their
behaviour log-probabilities and the reward; and a target policy's probability of each
logged action, and the importance weights that follow.

Probabilities of a target policy are given per action entry, as
``autotune.rl.acting.entry_probabilities`` returns them: 7 arrays ``(N, n_d)``. The
probability of a logged action is the product over the entries that mattered (``mask``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from autotune.errors import InputError
from autotune.rl.acting import action_mask
from autotune.rl.action import ACTION_DIMS

__all__ = [
    "ENTRIES",
    "EXPORT_COLUMNS",
    "LoggedDecisions",
    "Weights",
    "action_probability",
    "check_probabilities",
    "importance_weights",
]

ENTRIES = len(ACTION_DIMS)
EXPORT_COLUMNS = ("eps_id", "obs", "actions", "action_mask", "action_logp_dims", "rewards")
"""The columns of the export's ``transitions-*.parquet`` files that the estimates read."""
PROBABILITY_TOLERANCE = 1e-6
"""How far a row of entry probabilities may sum from 1."""
_LOGP_TOLERANCE = 1e-9


# --------------------------------------------------------------------------- logged data


def _as_episode_array(episode: Any) -> np.ndarray:
    """A 1-D array of episode ids; a list of tuples stays one id per row."""
    if isinstance(episode, np.ndarray):
        return episode
    values = list(episode)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _factorize(episode: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's episode as an index 0..E-1 in order of first appearance (so the folds
    and the bootstrap do not depend on how the ids are spelled), and E."""
    if episode.dtype != object:
        _, first, inverse = np.unique(episode, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        return rank[inverse.reshape(-1)], len(first)
    ids: dict[Any, int] = {}
    index = np.fromiter((ids.setdefault(e, len(ids)) for e in episode), np.int64, len(episode))
    return index, len(ids)


def _first_bad(bad: np.ndarray) -> int:
    """The first row (0-based) where a row-wise condition fails."""
    rows = bad.reshape(len(bad), -1).any(axis=1)
    return int(np.flatnonzero(rows)[0])


@dataclass(frozen=True, eq=False)
class LoggedDecisions:
    """N logged decisions, one job in one round each.

    ``running`` is the job's state when the policy acted. By ``action_mask``'s rule it is
    exactly ``mask[:, 0]``: ``change`` mattered for every running job (alone when it kept
    its configuration, with every other entry when it changed) and never for a waiting
    job (always configured, so ``change`` is ignored). The constructor checks that the mask
    follows that rule, since the reward model and the target probabilities rely on it.
    """

    episode: np.ndarray
    """``(N,)`` episode ids (any hashables, an array or a sequence; the export's ``eps_id``):
    the bootstrap's unit."""
    obs: np.ndarray
    """``(N, D)`` float observations (header + the job's slot features)."""
    entries: np.ndarray
    """``(N, 7)`` int: the action entries taken (``ACTION_DIMS``); stored as 0 where masked
    out (those values did not matter and need not be in range)."""
    mask: np.ndarray
    """``(N, 7)`` bool: the entries that mattered."""
    running: np.ndarray
    """``(N,)`` bool: the job was running (``mask[:, 0]``)."""
    logp_dims: np.ndarray
    """``(N, 7)`` float: the behaviour log-probability of each taken entry, 0 where masked
    out."""
    rewards: np.ndarray
    """``(N,)`` float: the reward of the round after the decision."""
    episode_index: np.ndarray = field(init=False, repr=False)
    """``(N,)`` each row's episode as 0..episodes-1."""
    episodes: int = field(init=False)
    """How many distinct episodes."""

    def __post_init__(self) -> None:
        obs = np.asarray(self.obs, dtype=np.float64)
        if obs.ndim != 2:
            raise InputError(f"obs of shape {obs.shape}: expected (N, D)")
        n = obs.shape[0]
        if n == 0:
            raise InputError("no logged decisions: the estimates need at least one row")
        episode = _as_episode_array(self.episode)
        entries = np.asarray(self.entries)
        mask = np.asarray(self.mask)
        running = np.asarray(self.running)
        logp = np.asarray(self.logp_dims, dtype=np.float64)
        rewards = np.asarray(self.rewards, dtype=np.float64)
        for name, array, shape in (
            ("episode", episode, (n,)),
            ("entries", entries, (n, ENTRIES)),
            ("mask", mask, (n, ENTRIES)),
            ("running", running, (n,)),
            ("logp_dims", logp, (n, ENTRIES)),
            ("rewards", rewards, (n,)),
        ):
            if array.shape != shape:
                raise InputError(f"{name} of shape {array.shape}: expected {shape} (N = {n})")
        if entries.dtype.kind not in "iub":
            raise InputError(f"entries of dtype {entries.dtype}: expected integers")
        entries = entries.astype(np.int64)
        for name, array in (("mask", mask), ("running", running)):
            if array.dtype != bool and not np.isin(array, (0, 1)).all():
                raise InputError(f"{name} must hold booleans")
        mask = mask.astype(bool)
        running = running.astype(bool)
        if not np.isfinite(obs).all():
            raise InputError(f"row {_first_bad(~np.isfinite(obs))}: obs is not finite")
        if not np.isfinite(rewards).all():
            raise InputError(f"row {_first_bad(~np.isfinite(rewards))}: reward is not finite")
        limits = np.asarray(ACTION_DIMS)
        out_of_range = mask & ((entries < 0) | (entries >= limits))
        if out_of_range.any():
            i = _first_bad(out_of_range)
            raise InputError(f"row {i}: action entries {entries[i].tolist()} outside {limits}")
        # Masked-out entries did not matter; any value is fine, 0 keeps indexing in range.
        entries = np.where(mask, entries, 0)
        if not np.array_equal(running, mask[:, 0]):
            raise InputError(f"row {_first_bad(running != mask[:, 0])}: running != mask[:, 0]")
        rule = action_mask(entries, running)
        if not np.array_equal(mask, rule):
            i = _first_bad(mask != rule)
            raise InputError(
                f"row {i}: action_mask {mask[i].astype(int).tolist()} does not follow the "
                f"rule for {'a running' if running[i] else 'a waiting'} job with entries "
                f"{entries[i].tolist()} (expected {rule[i].astype(int).tolist()})"
            )
        if np.isnan(logp).any():
            raise InputError(f"row {_first_bad(np.isnan(logp))}: behaviour log-prob is NaN")
        if (~mask & (logp != 0.0)).any():
            raise InputError(
                f"row {_first_bad(~mask & (logp != 0.0))}: a masked-out entry has a "
                "behaviour log-prob other than 0"
            )
        if (mask & np.isneginf(logp)).any():
            raise InputError(
                f"row {_first_bad(mask & np.isneginf(logp))}: zero behaviour probability "
                "for a taken action (no importance weight exists)"
            )
        if (logp > _LOGP_TOLERANCE).any():
            raise InputError(
                f"row {_first_bad(logp > _LOGP_TOLERANCE)}: behaviour log-prob above 0"
            )
        index, count = _factorize(episode)
        for name, value in (
            ("episode", episode),
            ("obs", obs),
            ("entries", entries),
            ("mask", mask),
            ("running", running),
            ("logp_dims", np.minimum(logp, 0.0)),
            ("rewards", rewards),
            ("episode_index", index),
            ("episodes", count),
        ):
            object.__setattr__(self, name, value)

    @property
    def rows(self) -> int:
        """N, the number of logged decisions."""
        return int(self.obs.shape[0])

    @property
    def behaviour_logp(self) -> np.ndarray:
        """``(N,)`` log mu(a_i | s_i), over the entries that mattered."""
        return np.asarray(self.logp_dims.sum(axis=1))

    @property
    def mean_reward(self) -> float:
        """The logged (on-policy) mean reward per decision."""
        return float(self.rewards.mean())

    @classmethod
    def from_table(cls, table: Any) -> LoggedDecisions:
        """From a pyarrow ``Table`` or a pandas ``DataFrame`` with the export's columns
        (``EXPORT_COLUMNS``: ``eps_id``, ``obs``, ``actions``, ``action_mask``,
        ``action_logp_dims``, ``rewards``); list columns may be fixed-size or plain lists
        (pandas: one array or list per cell). ``running`` is ``action_mask[:, 0]``."""
        if isinstance(table, pd.DataFrame):
            frame = table

            def column(name: str, width: int | None) -> np.ndarray:
                return _frame_column(frame, name, width)

        else:

            def column(name: str, width: int | None) -> np.ndarray:
                return _arrow_column(table, name, width)

        mask = column("action_mask", ENTRIES)
        if mask.dtype != bool:
            raise InputError(f"dtype {mask.dtype}: expected booleans", column="action_mask")
        return cls(
            episode=column("eps_id", None),
            obs=column("obs", -1),
            entries=column("actions", ENTRIES),
            mask=mask,
            running=mask[:, 0],
            logp_dims=column("action_logp_dims", ENTRIES),
            rewards=column("rewards", None),
        )

    @classmethod
    def from_export(cls, directory: str | Path) -> LoggedDecisions:
        """From an export directory's ``transitions-*.parquet`` files (only the columns
        the estimates need are read)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        root = Path(directory)
        files = sorted(root.glob("transitions-*.parquet"))
        if not files:
            raise InputError("no transitions-*.parquet files", path=str(root))
        tables = []
        for file in files:
            names = set(pq.read_schema(file).names)
            for name in EXPORT_COLUMNS:
                if name not in names:
                    raise InputError("missing column", path=str(file), column=name)
            tables.append(pq.read_table(file, columns=list(EXPORT_COLUMNS)))
        return cls.from_table(pa.concat_tables(tables))


def _arrow_column(table: Any, name: str, width: int | None) -> np.ndarray:
    """A pyarrow column as a numpy array: ``(N,)`` for ``width=None``, else ``(N, width)``
    (``width=-1``: whatever width the lists have, the same on every row)."""
    import pyarrow as pa

    if name not in table.column_names:
        raise InputError("missing column", column=name)
    chunked = table.column(name)
    if chunked.null_count:
        raise InputError(f"{chunked.null_count} null values", column=name)
    array = chunked.combine_chunks()
    if width is None:
        return np.asarray(array.to_numpy(zero_copy_only=False))
    kind = array.type
    if pa.types.is_fixed_size_list(kind):
        size = int(kind.list_size)
        values = array.flatten()
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = np.asarray(array.value_lengths().to_numpy(zero_copy_only=False))
        size = int(lengths[0]) if len(lengths) else max(width, 0)
        if (lengths != size).any():
            raise InputError("lists of different lengths", column=name)
        values = array.flatten()
    else:
        raise InputError(f"type {kind}: expected a list per row", column=name)
    if width >= 0 and size != width:
        raise InputError(f"{size} values per row: expected {width}", column=name)
    if values.null_count:
        raise InputError(f"{values.null_count} null values inside the lists", column=name)
    flat = np.asarray(values.to_numpy(zero_copy_only=False))
    return flat.reshape(len(array), size)


def _frame_column(frame: pd.DataFrame, name: str, width: int | None) -> np.ndarray:
    """A pandas column as a numpy array, like ``_arrow_column``."""
    if name not in frame.columns:
        raise InputError("missing column", column=name)
    values = frame[name].to_numpy()
    if width is None:
        return np.asarray(values)
    try:
        stacked = np.stack([np.asarray(v) for v in values]) if len(values) else np.empty((0, 0))
    except ValueError as exc:
        raise InputError(f"not one list of equal length per row ({exc})", column=name) from exc
    if stacked.ndim != 2 or (width >= 0 and len(values) and stacked.shape[1] != width):
        raise InputError(f"values of shape {stacked.shape[1:]}: expected ({width},)", column=name)
    if stacked.dtype == object:
        raise InputError("null or non-numeric values inside the lists", column=name)
    return stacked


# --------------------------------------------------------------------------- target policies


def check_probabilities(probs: Sequence[np.ndarray], rows: int, name: str) -> list[np.ndarray]:
    """``probs`` as 7 float arrays ``(rows, n_d)`` of probabilities summing to 1 per row."""
    if len(probs) != ENTRIES:
        raise InputError(f"{name}: {len(probs)} arrays, expected one per entry ({ENTRIES})")
    out = []
    for d, (p, n) in enumerate(zip(probs, ACTION_DIMS, strict=True)):
        array = np.asarray(p, dtype=np.float64)
        if array.shape != (rows, n):
            raise InputError(f"{name}[{d}] of shape {array.shape}: expected ({rows}, {n})")
        if not np.isfinite(array).all() or (array < 0).any():
            i = _first_bad(~np.isfinite(array) | (array < 0))
            raise InputError(f"{name}[{d}] row {i}: probabilities must be finite and >= 0")
        sums = array.sum(axis=1)
        off = np.abs(sums - 1.0) > PROBABILITY_TOLERANCE
        if off.any():
            i = _first_bad(off)
            raise InputError(f"{name}[{d}] row {i}: probabilities sum to {sums[i]:.9g}, not 1")
        out.append(array)
    return out


def action_probability(data: LoggedDecisions, probs: Sequence[np.ndarray]) -> np.ndarray:
    """``(N,)`` the probability of each logged action under a target policy: the product
    over the entries that mattered of the target's probability of the taken value."""
    checked = check_probabilities(probs, data.rows, "probabilities")
    rows = np.arange(data.rows)
    out = np.ones(data.rows)
    for d, p in enumerate(checked):
        out *= np.where(data.mask[:, d], p[rows, data.entries[:, d]], 1.0)
    return out


@dataclass(frozen=True, eq=False)
class Weights:
    """Importance weights of a target policy on the logged rows."""

    values: np.ndarray
    """``(N,)`` ``min(pi / mu, max_weight)``."""
    max_weight: float
    clipped_share: float
    """Share of rows whose ratio exceeded ``max_weight`` (and was clipped to it)."""

    @property
    def ess(self) -> float:
        """Effective sample size of the (clipped) weights, ``(sum w)^2 / sum w^2``."""
        square = float(np.square(self.values).sum())
        return float(self.values.sum()) ** 2 / square if square > 0 else 0.0

    @property
    def ess_share(self) -> float:
        """ESS over the number of rows (1 when the target is the behaviour policy)."""
        return self.ess / len(self.values)


def importance_weights(
    data: LoggedDecisions, probs: Sequence[np.ndarray], *, max_weight: float = 50.0
) -> Weights:
    """The clipped importance weights ``pi(a_i | s_i) / mu(a_i | s_i)`` of a target policy
    (per-entry probabilities) on the logged actions."""
    if not max_weight > 0:
        raise ValueError(f"max_weight={max_weight}: must be > 0")
    with np.errstate(divide="ignore"):
        log_target = np.log(action_probability(data, probs))
    raw = np.exp(log_target - data.behaviour_logp)
    clipped = raw > max_weight
    return Weights(
        values=np.minimum(raw, max_weight),
        max_weight=float(max_weight),
        clipped_share=float(clipped.mean()),
    )
