"""Calibrate the performance model on this machine from measured executor runs.

``calibrate()`` trains ``gpt-char`` under a grid of configurations (layouts x gradient
compression x precision), measures the median step time of each, fits the machine's
device (dense fp32 peak and the 16-bit speed relative to it) and the model's
coefficients (compute efficiency, per-step overhead, link latency and bandwidth
efficiency, compute/communication overlap) by least squares on log step time, and
reports the step-time MAPE in sample and leave-one-out (each configuration predicted by
a fit without it). The profile is saved as JSON; ``load_profile`` gives back the
``DeviceSpec`` and ``Coefficients`` the simulator's performance model takes.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from autotune.core import CompressionSpec, JobConfig, Layout, ModelProfile, PrecisionMap
from autotune.devices import DeviceSpec, device
from autotune.perfmodel import Coefficients, Shape, step_time

__all__ = [
    "GRID",
    "Measurement",
    "calibrate",
    "fit_profile",
    "gpt_char_profile",
    "load_profile",
]

TASK = "gpt-char"
BATCH = 16


def _config(
    dp: int = 1, tp: int = 1, pp: int = 1, *, compression: str = "none", precision: str = "fp32"
) -> JobConfig:
    spec = (
        CompressionSpec(kind="topk", ratio=0.01)
        if compression == "topk"
        else CompressionSpec(kind=compression)  # type: ignore[arg-type]
    )
    return JobConfig(
        layout=Layout(
            world_size=dp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batches=2 if pp > 1 else 1
        ),
        compression=spec,
        precision=PrecisionMap.uniform(precision),  # type: ignore[arg-type]
    )


GRID: tuple[JobConfig, ...] = (
    *(_config(precision=p) for p in ("fp32", "bf16")),
    *(
        _config(dp=2, compression=c, precision=p)
        for c in ("none", "topk", "int8")
        for p in ("fp32", "bf16")
    ),
    *(_config(tp=2, precision=p) for p in ("fp32", "bf16")),
    *(_config(pp=2, precision=p) for p in ("fp32", "bf16")),
)
"""12 configurations of at most 2 ranks (this machine's core count, so that ranks do not
time-share a core)."""


@dataclass(frozen=True, slots=True)
class Measurement:
    config: JobConfig
    step_time_s: float
    bytes_sent: int


def describe(config: JobConfig) -> str:
    layout, comp = config.layout, config.compression
    text = f"dp{layout.dp}xtp{layout.tp}xpp{layout.pp}"
    text += f" {comp.kind}{':' + str(comp.ratio) if comp.ratio else ''}"
    return f"{text} {config.precision.ffn}"


def gpt_char_profile() -> ModelProfile:
    """``gpt-char``'s shape for the performance model: FLOPs as 6 x parameters x tokens
    plus attention's 12 x layers x context^2 x width (PaLM appendix B)."""
    from autotune.executor.tasks import GPTConfig

    c = GPTConfig()
    per_block = (
        4 * (c.width * c.width + c.width) + 2 * c.width * 4 * c.width + 5 * c.width + 4 * c.width
    )
    parameters = (
        c.vocab * c.width
        + c.context * c.width
        + c.layers * per_block
        + 2 * c.width
        + c.width * c.vocab
    )
    flops = 6 * parameters * c.context + 12 * c.layers * c.context**2 * c.width
    return ModelProfile(
        name=TASK,
        parameters=parameters,
        flops_per_sample=float(flops),
        activation_bytes_per_sample=float(34 * c.context * c.width * c.layers * 2),
        num_layers=c.layers,
        hidden_size=c.width,
        seq_len=c.context,
        reference_batch=BATCH,
    )


# Free parameters: (name, lower, upper); all fitted in log space. One rank is one core
# on CPU: 0.5 TFLOP/s is above any core's fp32 peak (2 AVX-512 FMA x 16 lanes x 2 FLOP x
# 4 GHz = 0.26), so the bound only keeps the fit physical.
_FREE: tuple[tuple[str, float, float], ...] = (
    ("peak_fp32_tflops", 1e-4, 0.5),
    ("bf16_speed", 0.05, 4.0),
    ("compute_overhead_s", 1e-5, 1.0),
    ("intra_latency_s", 1e-7, 0.1),
    ("intra_bw_efficiency", 1e-3, 1.0),
    ("overlap_gamma", 1.0, 10.0),
)


def _device(base: DeviceSpec, peak: float, bf16_speed: float) -> DeviceSpec:
    tflops = {"fp32": peak, "bf16": peak * bf16_speed}
    return replace(base, name=f"{base.name}-calibrated", peak_tflops=MappingProxyType(tflops))


def _decode(theta: np.ndarray, base: DeviceSpec) -> tuple[DeviceSpec, Coefficients]:
    values = {
        name: float(min(max(math.exp(x), low), high))
        for (name, low, high), x in zip(_FREE, theta, strict=True)
    }
    spec = _device(base, values.pop("peak_fp32_tflops"), values.pop("bf16_speed"))
    return spec, Coefficients(mfu=1.0, **values)


def _predict(
    profile: ModelProfile, rows: Sequence[Measurement], spec: DeviceSpec, coeffs: Coefficients
) -> np.ndarray:
    times: np.ndarray = np.array(
        [
            step_time(
                profile,
                m.config,
                Shape(gpu_model=spec.name, ranks_per_node=(m.config.world_size,)),
                BATCH,
                coeffs=coeffs,
                spec=spec,
            ).step_s
            for m in rows
        ]
    )
    return times


def fit_profile(
    profile: ModelProfile, rows: Sequence[Measurement], base: DeviceSpec
) -> tuple[DeviceSpec, Coefficients]:
    """Least squares on log step time from the catalog device and literature defaults."""
    from scipy.optimize import least_squares

    measured = np.log([m.step_time_s for m in rows])
    start = {
        "peak_fp32_tflops": 0.05,
        "bf16_speed": 1.0,
        "compute_overhead_s": 0.01,
        "intra_latency_s": 1e-4,
        "intra_bw_efficiency": 0.1,
        "overlap_gamma": 1.5,
    }
    theta0 = np.log([start[name] for name, _, _ in _FREE])
    lower = np.log([low for _, low, _ in _FREE])
    upper = np.log([high for _, _, high in _FREE])
    theta0 = np.clip(theta0, lower + 1e-9, upper - 1e-9)

    def residuals(theta: np.ndarray) -> np.ndarray:
        spec, coeffs = _decode(theta, base)
        errors: np.ndarray = np.log(_predict(profile, rows, spec, coeffs)) - measured
        return errors

    result = least_squares(residuals, theta0, bounds=(lower, upper), loss="soft_l1")
    return _decode(result.x, base)


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def measure(config: JobConfig, *, steps: int, seed: int = 0, warmup: int = 2) -> Measurement:
    from autotune.executor.runner import JobRunner

    result = JobRunner(TASK, config, steps=steps + warmup, batch_size=BATCH, seed=seed).run()
    times = result.step_times_s[warmup:]
    return Measurement(config, statistics.median(times), result.bytes_sent)


def calibrate(
    *,
    steps: int = 20,
    seed: int = 0,
    grid: Sequence[JobConfig] = GRID,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    """Measure ``grid``, fit, and report (Ray must be connected)."""
    profile = gpt_char_profile()
    base = device("CPU")
    rows = []
    for i, config in enumerate(grid):
        if progress:
            progress(i, len(grid), describe(config))
        rows.append(measure(config, steps=steps, seed=seed))
    if progress:
        progress(len(grid), len(grid), "fitting")
    spec, coeffs = fit_profile(profile, rows, base)
    measured = np.array([m.step_time_s for m in rows])
    predicted = _predict(profile, rows, spec, coeffs)
    held_out = []
    for i in range(len(rows)):
        rest = [m for j, m in enumerate(rows) if j != i]
        spec_i, coeffs_i = fit_profile(profile, rest, base)
        held_out.append(float(_predict(profile, [rows[i]], spec_i, coeffs_i)[0]))
    held = np.array(held_out)
    return {
        "machine": {
            "node": platform.node(),
            "processor": platform.processor() or platform.machine(),
        },
        "task": TASK,
        "global_batch": BATCH,
        "steps": steps,
        "seed": seed,
        "device": {
            "name": spec.name,
            "base": base.name,
            "peak_tflops": dict(spec.peak_tflops),
        },
        "coefficients": {f.name: getattr(coeffs, f.name) for f in fields(coeffs)},
        "configs": [
            {
                "config": describe(m.config),
                "measured_step_s": round(m.step_time_s, 5),
                "predicted_step_s": round(float(p), 5),
                "held_out_predicted_step_s": round(h, 5),
                "bytes_sent": m.bytes_sent,
            }
            for m, p, h in zip(rows, predicted, held, strict=True)
        ],
        "mape_step_time": round(_mape(predicted, measured), 4),
        "mape_step_time_held_out": round(_mape(held, measured), 4),
        "target_mape": 0.15,
    }


def save_profile(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)


def load_profile(path: str | Path) -> tuple[DeviceSpec, Coefficients]:
    """The calibrated device and coefficients saved by ``autotune calibrate``."""
    report = json.loads(Path(path).read_text())
    base = device(report["device"]["base"])
    peaks = report["device"]["peak_tflops"]
    spec = _device(base, peaks["fp32"], peaks["bf16"] / peaks["fp32"])
    return spec, Coefficients(**report["coefficients"])
