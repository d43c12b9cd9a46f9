"""Why a decision: the features that mattered, the alternatives considered with their
predicted goodput, and why the chosen configuration won.

Alternatives are the chosen configuration's neighbours on the same GPUs: each other
precision, each gradient compression, and activation checkpointing switched. Their
goodput (samples/s times statistical efficiency, ``autotune.perf.model.estimate``) is
the performance model's prediction, not a measurement: with the job's online fit of its
own steps once it has one, else the catalog's coefficients for its model; the
explanation says which (``performance_model``). The rule-based policy does not
maximise it, so the explanation says so when an alternative is predicted to be better.

The statistical efficiency (``statistical_efficiency``) says, factor by factor, which was
measured on the job and which assumed: the batch's from the gradient noise scale the job
measured (``JobMetrics.noise_scale``) where it did, else from the one the cluster's
calibration measured of its task, else from the catalog's; the
compression's from the steps to a target the cluster's calibration measured of its task
under that compression (``autotune calibrate --efficiency``) where it did, else from the
catalog's constant; the precision's from the catalog's constant; with the compression
fidelity the job measured beside them where it did.

``chosen.devices`` says where the figures of each GPU model of the placement come from:
its catalog entry's source (a datasheet, the table of known parts, an estimate from the
device's properties, a calibration: ``autotune.catalog.detect``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from autotune.catalog.applications import catalog_coefficients
from autotune.catalog.devices import device
from autotune.catalog.tasks import measured_noise_scale
from autotune.core import (
    CompressionSpec,
    JobConfig,
    JobSpec,
    ModelProfile,
    NodeInfo,
    Placement,
    Precision,
    PrecisionMap,
)
from autotune.interfaces import JobMetrics
from autotune.perf.model import (
    batch_efficiency,
    compression_efficiency,
    estimate,
    precision_efficiency,
    shape_of,
)
from autotune.perf.online import JobModel

__all__ = ["explain_decision"]

_PRECISIONS: Final[tuple[Precision, ...]] = ("fp32", "bf16", "fp16", "fp8")
_COMPRESSIONS: Final = (
    CompressionSpec(),
    CompressionSpec(kind="int8"),
    CompressionSpec(kind="fp8"),
    CompressionSpec(kind="topk", ratio=0.01),
    CompressionSpec(kind="powersgd", rank=4),
)
_MAX_ALTERNATIVES: Final = 8


def _neighbours(config: JobConfig) -> list[tuple[str, JobConfig]]:
    out: list[tuple[str, JobConfig]] = []
    for precision in _PRECISIONS:
        candidate = PrecisionMap.uniform(precision)
        if candidate != config.precision:
            out.append((f"precision {precision}", replace(config, precision=candidate)))
    if config.layout.dp > 1:
        for compression in _COMPRESSIONS:
            if compression != config.compression:
                out.append(
                    (f"compression {compression.kind}", replace(config, compression=compression))
                )
    toggled = replace(
        config.layout, activation_checkpointing=not config.layout.activation_checkpointing
    )
    out.append(
        (
            "activation checkpointing " + ("on" if toggled.activation_checkpointing else "off"),
            replace(config, layout=toggled),
        )
    )
    return out


def explain_decision(
    *,
    spec: JobSpec,
    config: JobConfig,
    placement: Placement,
    nodes: Mapping[str, NodeInfo],
    features: Mapping[str, float],
    why: str,
    model: JobModel | None = None,
    metrics: JobMetrics | None = None,
    balanced: bool = False,
) -> dict[str, Any]:
    """The explanation stored with a decision (a JSON object). ``model``: the job's
    throughput model (its online fit, ``autotune.daemon.performance``); ``None``: the
    catalog's coefficients for its model. ``balanced``: ranks on several GPU models take
    batch shares by speed (``ClusterSnapshot.mixes_models``)."""
    explanation: dict[str, Any] = {
        "features": {name: round(float(value), 6) for name, value in features.items()},
        "chosen": {"config": config.describe(), "devices": _device_sources(placement, nodes)},
        "alternatives": [],
        "why": why,
    }
    if spec.model is None:
        explanation["why"] += "; no model profile: goodput cannot be predicted"
        return explanation
    profile = spec.model.with_noise_scale(metrics.noise_scale if metrics is not None else None)
    explanation["statistical_efficiency"] = _efficiency(spec, profile, config, metrics)
    shape = shape_of(placement, nodes, balanced=balanced)
    if model is None:
        model = JobModel(
            coefficients=catalog_coefficients(spec.model, shape.gpu_model), source="catalog"
        )
    coeffs = model.coefficients
    explanation["performance_model"] = {
        "source": model.source,
        "points": model.points,
        "fit_error": model.fit_error,
        "described": model.describe(),
    }
    chosen = estimate(profile, config, shape, config.batch(spec), coeffs=coeffs)
    explanation["chosen"] |= {
        "predicted_goodput": round(chosen.goodput, 3),
        "predicted_samples_per_s": round(chosen.step.samples_per_s, 3),
        "memory_gib": round(chosen.memory_bytes / (1 << 30), 2),
    }
    scored: list[tuple[str, JobConfig, float, bool]] = []
    for change, candidate in _neighbours(config):
        predicted = estimate(profile, candidate, shape, candidate.batch(spec), coeffs=coeffs)
        scored.append((change, candidate, predicted.goodput, not predicted.oom))
    scored.sort(key=lambda item: -item[2])
    explanation["alternatives"] = [
        {
            "change": change,
            "config": candidate.describe(),
            "predicted_goodput": round(goodput, 3),
            "fits_memory": fits,
        }
        for change, candidate, goodput, fits in scored[:_MAX_ALTERNATIVES]
    ]
    best = next((item for item in scored if item[3]), None)
    if best is None or best[2] <= chosen.goodput:
        explanation["why"] += (
            f"; predicted goodput {chosen.goodput:.1f}, no neighbour on these GPUs predicts more"
        )
    else:
        gain = best[2] / max(chosen.goodput, 1e-9) - 1
        explanation["why"] += (
            f"; predicted goodput {chosen.goodput:.1f}; the performance model predicts "
            f"{gain:+.0%} with {best[0]}"
        )
    return explanation


def _device_sources(placement: Placement, nodes: Mapping[str, NodeInfo]) -> dict[str, str]:
    """Where the figures of each GPU model of ``placement`` come from."""
    models = {nodes[s.node_id].gpu_model for s in placement.ranks if s.node_id in nodes}
    out: dict[str, str] = {}
    for model in sorted(models - {""}):
        try:
            out[model] = device(model).source
        except KeyError:
            out[model] = "unknown to this process's catalog"
    return out


def _efficiency(
    spec: JobSpec, profile: ModelProfile, config: JobConfig, metrics: JobMetrics | None
) -> dict[str, Any]:
    """Each factor of the chosen configuration's statistical efficiency, and where it
    comes from."""
    if profile is not spec.model:  # with_noise_scale took the job's measurement
        noise_source = "measured noise scale"
    elif spec.model.noise_scale > 0 and measured_noise_scale(spec.model.name) == (
        spec.model.noise_scale
    ):
        noise_source = "measured in the cluster's calibration (autotune calibrate)"
    else:
        noise_source = "assumed (catalog noise scale)"
    batch = config.batch(spec)
    measured = str(config.compression) in dict(profile.compression_efficiency)
    compression: dict[str, Any] = {
        "value": round(compression_efficiency(config.compression, profile), 4),
        "source": (
            "measured in the cluster's calibration (autotune calibrate --efficiency)"
            if measured
            else "assumed (catalog constant)"
        ),
    }
    if metrics is not None and metrics.compression_cosine is not None:
        compression["measured_cosine"] = round(metrics.compression_cosine, 4)
        if metrics.compression_error is not None:
            compression["measured_relative_error"] = round(metrics.compression_error, 4)
    return {
        "batch": {
            "value": round(batch_efficiency(profile, batch), 4),
            "global_batch": batch,
            "noise_scale": round(profile.noise_scale, 3),
            "source": noise_source,
        },
        "compression": compression,
        "precision": {
            "value": round(precision_efficiency(config.precision), 4),
            "source": "assumed (catalog constant)",
        },
    }
