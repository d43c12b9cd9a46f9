"""Logged transitions, the decision rounds replay learns from: a round written when
decided and its reward when the next round measured it, the compacted form of their
JSON columns, and the record of which rounds an export covered."""

from __future__ import annotations

import json
import zlib
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from autotune.core import utc_now
from autotune.db.tables import TransitionExportRow, TransitionRow

__all__ = [
    "create_transition",
    "pack_transition",
    "record_transition_export",
    "set_transition_reward",
    "transition_payload",
    "truncate_open_transitions",
]


def create_transition(
    *,
    session: Session,
    episode: str,
    step: int,
    policy_version: str,
    epsilon: float,
    observation: bytes,
    slots: dict[str, Any],
    sim_time_s: float | None = None,
    at: datetime | None = None,
) -> int:
    """Log one decision round (``TransitionRow``); its reward comes later
    (``set_transition_reward``). ``at``: when it was decided (default now)."""
    row = TransitionRow(
        episode=episode,
        step=step,
        policy_version=policy_version,
        epsilon=epsilon,
        sim_time_s=sim_time_s,
        observation=observation,
        slots=slots,
        reward=None,
        reward_parts=None,
        truncated=False,
        created_at=at or utc_now(),
    )
    session.add(row)
    session.flush()
    return row.id


def set_transition_reward(
    *,
    session: Session,
    transition_id: int,
    reward: float | None,
    parts: dict[str, Any] | None,
    truncated: bool = False,
) -> None:
    """Fill in what the round after a logged decision produced; ``truncated``: the
    episode ends with this round."""
    session.execute(
        update(TransitionRow)
        .where(TransitionRow.id == transition_id)
        .values(reward=reward, reward_parts=parts, truncated=truncated)
    )


def pack_transition(slots: dict[str, Any], reward_parts: dict[str, Any] | None) -> bytes:
    """A logged round's JSON columns as a compacted row stores them (``TransitionRow.packed``)."""
    text = json.dumps({"slots": slots, "reward_parts": reward_parts}, separators=(",", ":"))
    return zlib.compress(text.encode(), 6)


def transition_payload(
    slots: dict[str, Any], reward_parts: dict[str, Any] | None, packed: bytes | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(slots, reward_parts)`` of a logged round, compacted or not."""
    if packed is None:
        return slots, reward_parts
    data = json.loads(zlib.decompress(packed))
    return data["slots"], data["reward_parts"]


def truncate_open_transitions(*, session: Session) -> int:
    """Mark every logged round still waiting for its reward as the end of its episode
    (the daemon stopped before measuring it); returns how many."""
    result = session.execute(
        update(TransitionRow)
        .where(TransitionRow.reward.is_(None), TransitionRow.truncated.is_(False))
        .values(truncated=True)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def record_transition_export(
    *, session: Session, first_id: int, last_id: int, rounds: int, path: str
) -> None:
    """An export read the transitions ``first_id`` to ``last_id`` (every one between)."""
    session.add(
        TransitionExportRow(
            first_id=first_id, last_id=last_id, rounds=rounds, path=path, exported_at=utc_now()
        )
    )
