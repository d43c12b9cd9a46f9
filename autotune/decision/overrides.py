"""Overrides: a user pins part of a job's configuration or its placement for a while.

A pin is a JSON object with any of these keys (``PIN_KEYS``)::

    {"layout": {"world_size": 4, "tp": 2, ...},        # any Layout fields
     "precision": {"ffn": "bf16", ...},                # any PrecisionMap fields
     "compression": {"kind": "topk", "ratio": 0.01},   # a whole CompressionSpec
     "placement": [{"node_id": "a100-0", "gpu_index": 0}, ...]}   # rank 0, 1, ...

Fields not pinned come from the configuration the job would have had without the
override (the policy's choice, or its current one). Pinning the world size (or a
placement, which implies it) without ``dp`` lets ``dp`` be the rest of the layout.

``check_override`` is what the API runs before it stores an override: the pinned
configuration must be valid, within the job's GPU range, and fit in memory on GPUs of
an allowed model (the Planner's own feasibility check), and a pinned placement must
name GPUs that exist, of an allowed model, with the memory for one rank. What is wrong
raises a ``FieldError`` whose ``field`` is the pin key at fault (``layout``,
``placement``, ...), and whose message starts with ``pin.<key>`` where it names a field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, Final

from autotune.core import (
    CompressionSpec,
    JobConfig,
    JobSpec,
    Layout,
    NodeInfo,
    Placement,
    PrecisionMap,
    RankSlot,
)
from autotune.errors import FieldError
from autotune.perf.memory import rank_memory
from autotune.planner import plan, verify_placements

__all__ = ["PIN_KEYS", "check_override", "pinned_config", "pinned_placement"]

PIN_KEYS: Final = ("layout", "precision", "compression", "placement")
_LAYOUT_FIELDS: Final = tuple(f.name for f in fields(Layout))


def pinned_config(base: JobConfig, pin: Mapping[str, Any]) -> JobConfig:
    """``base`` with the pinned fields replaced; ``FieldError`` naming the pin key when
    the result is not a valid configuration."""
    unknown = set(pin) - set(PIN_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise FieldError(key, f"pin.{key}: unknown; pin one of {', '.join(PIN_KEYS)}")
    layout_pin = dict(pin.get("layout") or {})
    bad = set(layout_pin) - set(_LAYOUT_FIELDS)
    if bad:
        raise FieldError("layout", f"pin.layout.{sorted(bad)[0]}: not a layout field")
    placement = pin.get("placement")
    if placement is not None:
        world = len(placement)
        if layout_pin.get("world_size", world) != world:
            raise FieldError(
                "layout",
                f"pin.layout.world_size={layout_pin['world_size']}: the pinned placement "
                f"has {world} ranks",
            )
        layout_pin["world_size"] = world
    layout_fields = {name: getattr(base.layout, name) for name in _LAYOUT_FIELDS}
    changes_shape = any(
        name in layout_pin and layout_pin[name] != layout_fields[name]
        for name in ("world_size", "tp", "pp")
    )
    if changes_shape and "dp" not in layout_pin:
        layout_fields["dp"] = -1  # the rest
    layout_fields.update(layout_pin)
    try:
        layout = Layout(**layout_fields)
    except (TypeError, ValueError) as exc:
        raise FieldError("layout", f"pin.layout: {exc}") from exc
    precision_pin = pin.get("precision") or {}
    try:
        precision = PrecisionMap(**{**base.precision.as_dict(), **precision_pin})
    except (TypeError, ValueError) as exc:
        raise FieldError("precision", f"pin.precision: {exc}") from exc
    compression = base.compression
    if pin.get("compression") is not None:
        try:
            compression = CompressionSpec(**pin["compression"])
        except (TypeError, ValueError) as exc:
            raise FieldError("compression", f"pin.compression: {exc}") from exc
    return JobConfig(layout=layout, precision=precision, compression=compression)


def pinned_placement(spec: JobSpec, pin: Mapping[str, Any]) -> Placement | None:
    """The pinned placement (rank i on the i-th GPU listed), or ``None`` if none."""
    ranks: Sequence[Mapping[str, Any]] | None = pin.get("placement")
    if ranks is None:
        return None
    try:
        return Placement(
            job_id=spec.job_id,
            ranks=tuple(
                RankSlot(
                    rank=i,
                    node_id=slot["node_id"],
                    gpu_index=slot["gpu_index"],
                    gpu_milli=spec.gpu_milli,
                )
                for i, slot in enumerate(ranks)
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FieldError("placement", f"pin.placement: {exc}") from exc


def check_override(
    spec: JobSpec, base: JobConfig, pin: Mapping[str, Any], nodes: Sequence[NodeInfo]
) -> tuple[JobConfig, Placement | None]:
    """The configuration and placement the override pins; ``FieldError`` with the reason
    when it is infeasible on ``nodes`` (other jobs' use of the GPUs aside: a pinned
    placement takes its GPUs first when the override is applied). A configuration that
    fits nowhere is reported at the first key pinned, a placement that does not work at
    ``placement``."""
    config = pinned_config(base, pin)
    placement = pinned_placement(spec, pin)
    result = plan(
        [spec], nodes, {spec.job_id: config}, {} if placement is None else {spec.job_id: placement}
    )
    if spec.job_id in result.unplaced:
        first = next((key for key in PIN_KEYS if key in pin), "layout")
        raise FieldError(first, f"infeasible: {result.unplaced[spec.job_id]}")
    if placement is not None and spec.job_id not in result.kept:
        problems = verify_placements([spec], nodes, {spec.job_id: placement})
        problems += _memory_problems(spec, config, placement, nodes)
        raise FieldError(
            "placement",
            "infeasible placement: "
            + (problems[0] if problems else "a node lacks the job's CPU or host memory"),
        )
    return config, placement


def _memory_problems(
    spec: JobSpec, config: JobConfig, placement: Placement, nodes: Sequence[NodeInfo]
) -> list[str]:
    if spec.model is None:
        return []
    estimate = rank_memory(spec.model, config, config.batch(spec))
    by_id = {n.node_id: n for n in nodes}
    return [
        f"out of memory on {node.node_id} ({node.gpu_model}, "
        f"{node.gpu_memory_bytes / (1 << 30):.0f} GiB): needs {estimate.describe()}"
        for node_id in placement.nodes
        if (node := by_id.get(node_id)) is not None
        and not estimate.fits(node.gpu_memory_bytes, spec.gpu_milli)
    ]
