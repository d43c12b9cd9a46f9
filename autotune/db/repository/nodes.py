"""Nodes: the cluster's machines as the backend reports them (alive, parked, waking or
lost), and when each was lost."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autotune.core import NODE_STATES, NodeInfo, NodeState, utc_now
from autotune.db.tables import NodeRow
from autotune.serde import from_json, to_json

__all__ = ["NodeRecord", "list_nodes", "node_records", "upsert_nodes"]


@dataclass(frozen=True, slots=True)
class NodeRecord:
    info: NodeInfo
    state: NodeState
    lost_at: datetime | None


def upsert_nodes(
    *,
    session: Session,
    nodes: Iterable[NodeInfo],
    lost: Iterable[NodeInfo] = (),
    parked: Iterable[NodeInfo] = (),
    waking: Iterable[NodeInfo] = (),
    at: datetime | None = None,
) -> list[str]:
    """Record the backend's alive ``nodes``, its ``lost`` ones, and the ``parked`` and
    ``waking`` ones of provisioning; returns the names of nodes that are newly lost.
    ``at``: when (default now)."""
    now = at or utc_now()
    newly_lost: list[str] = []
    states: list[tuple[NodeInfo, NodeState]] = [
        *((n, "alive") for n in nodes),
        *((n, "parked") for n in parked),
        *((n, "waking") for n in waking),
        *((n, "lost") for n in lost),
    ]
    for node, state in states:
        row = session.get(NodeRow, node.node_id)
        info = to_json(node)
        if row is None:
            session.add(
                NodeRow(
                    node_id=node.node_id,
                    gpu_model=node.gpu_model,
                    gpu_count=node.gpu_count,
                    info=info,
                    updated_at=now,
                    state=state,
                    lost_at=now if state == "lost" else None,
                )
            )
            if state == "lost":
                newly_lost.append(node.node_id)
            continue
        if row.info != info:
            row.gpu_model, row.gpu_count, row.info, row.updated_at = (
                node.gpu_model,
                node.gpu_count,
                info,
                now,
            )
        if row.state != state:
            row.state, row.updated_at = state, now
            row.lost_at = now if state == "lost" else None
            if state == "lost":
                newly_lost.append(node.node_id)
    return newly_lost


def list_nodes(*, session: Session) -> list[NodeInfo]:
    """The alive nodes (the ones jobs can be placed on)."""
    rows = session.scalars(
        select(NodeRow).where(NodeRow.state == "alive").order_by(NodeRow.node_id)
    )
    return [from_json(NodeInfo, row.info) for row in rows]


def node_records(*, session: Session) -> list[NodeRecord]:
    """Every node the daemon has seen, alive or lost."""
    rows = session.scalars(select(NodeRow).order_by(NodeRow.node_id))
    return [
        NodeRecord(
            info=from_json(NodeInfo, row.info),
            state=row.state if row.state in NODE_STATES else "alive",
            lost_at=row.lost_at,
        )
        for row in rows
    ]
