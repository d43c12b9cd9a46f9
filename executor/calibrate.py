"""Calibrate the performance model on this machine from measured executor runs.

``calibrate()`` trains ``gpt-char`` under a grid of configurations (layouts x gradient
compression x precision), measures the median step time of each, fits the machine's
device (dense fp32 peak and the 16-bit speed relative to it) and the model's
coefficients (compute efficiency, per-step overhead, link latency and bandwidth
efficiency, compute/communication overlap) by least squares on log step time, and
reports the step-time MAPE in sample and leave-one-out (each configuration predicted by
a fit without it). The report also keeps the gradient noise scale the runs measured of
the task (``statistics``), which a cluster file's calibration makes the task's prior
(``autotune.catalog.tasks.task_profile``). The profile is saved as JSON;
``load_profile`` gives back the ``DeviceSpec`` and ``Coefficients`` the simulator's
performance model takes.
"""

from __future__ import annotations

import collections
import json
import platform
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.catalog.clusters import ClusterDescription, calibration_profile
from autotune.catalog.devices import DeviceSpec, calibrated_device, device
from autotune.catalog.tasks import BUILTIN_TASKS, GPTConfig
from autotune.core import CompressionSpec, JobConfig, Layout, ModelProfile, PrecisionMap
from autotune.errors import InputError
from autotune.perf.fit import Parameter, fit_bounded, mape
from autotune.perf.model import Coefficients, Shape, StepTime, step_time, tp_spans_nodes

__all__ = [
    "CLUSTER_STEPS",
    "COMPUTE_FREE",
    "GRID",
    "LARGE_BATCH",
    "LINK_FREE",
    "LOCAL_STEPS",
    "TASK",
    "TP_LATENCY",
    "Measurement",
    "calibrate",
    "calibrate_compute",
    "compute_grid",
    "fit_compute",
    "fit_profile",
    "link_free",
    "link_grid",
    "load_profile",
    "step_of",
    "task_statistics",
]

TASK = "gpt-char"
BATCH = GPTConfig().batch_size


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
    shape: Shape | None = None
    """Where its ranks ran (the ranks per machine and the link between machines);
    ``None``: all on this machine."""
    batch: int = BATCH
    """Its global batch."""
    sync_s: float | None = None
    """The gradient synchronisation the step did not hide, where measured
    (``JobMetrics.sync_time_s``): the fit then also matches the model's compute to the
    step without it, as the Pollux fit does."""
    noise_scale: float | None = None
    """The gradient noise scale the run measured (``JobResult.summary``), where it made
    enough measurements."""


# Free parameters, all fitted on a log scale. One rank is one core on CPU: 0.5 TFLOP/s is
# above any core's fp32 peak (2 AVX-512 FMA x 16 lanes x 2 FLOP x 4 GHz = 0.26), so the
# bound only keeps the fit physical.
_FREE: tuple[Parameter, ...] = (
    Parameter(name="peak_fp32_tflops", start=0.05, low=1e-4, high=0.5),
    Parameter(name="bf16_speed", start=1.0, low=0.05, high=4.0),
    Parameter(name="compute_overhead_s", start=0.01, low=1e-5, high=1.0),
    Parameter(name="intra_latency_s", start=1e-4, low=1e-7, high=0.1),
    Parameter(name="intra_bw_efficiency", start=0.1, low=1e-3, high=1.0),
    Parameter(name="overlap_gamma", start=1.5, low=1.0, high=10.0),
)
LINK_FREE: tuple[Parameter, ...] = (
    *(p for p in _FREE if not p.name.startswith("intra_")),
    Parameter(name="inter_latency_s", start=1e-4, low=1e-7, high=0.1),
    Parameter(name="inter_bw_efficiency", start=0.7, low=1e-3, high=1.0),
)
"""The parameters of machines one rank each, on a network: their link's latency and
achieved share of its bandwidth instead of the (unused) intra-node ones."""
TP_LATENCY = Parameter(name="tp_latency_s", start=1e-3, low=1e-6, high=0.1)
"""A ring step of a tensor-parallel group's activation all-reduce across machines. It is
not the data-parallel reduction's (``inter_latency_s``): that one is paid once a step,
after the whole backward, and carries what waiting for the other ranks costs there;
these are paid 4 times a layer, between layers. On four testbed machines: 2.3-5.7 ms
against 8.8-11.3 ms at 1 Gbit/s, 6.8 ms against 3.2 ms at 100 Mbit/s (the wire's own:
0.35 ms)."""


def link_free(rows: Sequence[Measurement]) -> tuple[Parameter, ...]:
    """``LINK_FREE``, and ``TP_LATENCY`` where a run of ``rows`` had a tensor-parallel
    group across machines (elsewhere nothing measures it)."""
    spans = any(m.shape is not None and tp_spans_nodes(m.config.layout, m.shape) for m in rows)
    return (*LINK_FREE, TP_LATENCY) if spans else LINK_FREE


def _device(base: DeviceSpec, peak: float, bf16_speed: float) -> DeviceSpec:
    return calibrated_device(base, {"fp32": peak, "bf16": peak * bf16_speed})


def _split(values: Mapping[str, float], base: DeviceSpec) -> tuple[DeviceSpec, Coefficients]:
    rest = dict(values)
    spec = _device(base, rest.pop("peak_fp32_tflops"), rest.pop("bf16_speed"))
    # What is measured is the executor: its reductions (fp32 gradients, all-gathered
    # codes, compressed reductions after backward) are the model's.
    return spec, Coefficients(mfu=1.0, executor_reduction=True, **rest)


def _predict(
    profile: ModelProfile, rows: Sequence[Measurement], spec: DeviceSpec, coeffs: Coefficients
) -> np.ndarray:
    times: np.ndarray = np.array([step_of(profile, m, spec, coeffs).step_s for m in rows])
    return times


def step_of(
    profile: ModelProfile, m: Measurement, spec: DeviceSpec, coeffs: Coefficients
) -> StepTime:
    """The performance model's step of measurement ``m``'s configuration where it ran."""
    shape = (
        replace(m.shape, gpu_model=spec.name)
        if m.shape is not None
        else Shape(gpu_model=spec.name, ranks_per_node=(m.config.world_size,))
    )
    return step_time(profile, m.config, shape, m.batch, coeffs=coeffs, spec=spec)


def _fit(
    profile: ModelProfile,
    rows: Sequence[Measurement],
    free: Sequence[Parameter],
    build: Callable[[Mapping[str, float]], tuple[DeviceSpec, Coefficients]],
) -> tuple[DeviceSpec, Coefficients]:
    """Least squares on log step time (and, where measured, log compute: the step less
    the synchronisation no rank hid) over ``free``, ``build`` making the model's device
    and coefficients of their values."""
    measured = np.log([m.step_time_s for m in rows])
    split = [m for m in rows if m.sync_s is not None and 0 <= m.sync_s < m.step_time_s]
    compute = np.log([m.step_time_s - (m.sync_s or 0.0) for m in split])

    def residuals(values: Mapping[str, float]) -> np.ndarray:
        spec, coeffs = build(values)
        errors: np.ndarray = np.log(_predict(profile, rows, spec, coeffs)) - measured
        if split:
            modelled = [step_of(profile, m, spec, coeffs).compute_s for m in split]
            errors = np.concatenate([errors, np.log(modelled) - compute])
        return errors

    return build(fit_bounded(free, residuals))


def fit_profile(
    profile: ModelProfile,
    rows: Sequence[Measurement],
    base: DeviceSpec,
    free: Sequence[Parameter] = _FREE,
) -> tuple[DeviceSpec, Coefficients]:
    """Least squares on log step time from the catalog device and literature defaults,
    over the parameters ``free`` (``LINK_FREE`` for machines on a network)."""
    return _fit(profile, rows, free, lambda values: _split(values, base))


COMPUTE_FREE: tuple[Parameter, ...] = (
    Parameter(name="mfu", start=0.5, low=1e-3, high=1.0),
    Parameter(name="compute_overhead_s", start=0.01, low=1e-5, high=1.0),
    Parameter(name="inter_latency_s", start=1e-3, low=1e-6, high=0.1),
)
"""A task's own costs on a calibrated cluster: its share of the calibrated device's
speed (the calibration's task runs at 1), its fixed per-step time (optimizer, data, the
framework's per-operation cost, which grows with a model's operations, not its FLOPs),
and the fixed cost of each step of its collectives. The last is what the link fit
calls a ring step's latency, but on gpt-char it comes out 10-30x the wire's (9 ms
against 0.3-1.4 ms measured by ``autotune cluster describe`` at 1 Gbit/s): it carries
the wait for the slowest rank, which grows with the task's step (a task of short steps
waits less). The device, the links' achieved bandwidth and the overlap stay the
cluster's."""


def fit_compute(
    profile: ModelProfile, rows: Sequence[Measurement], spec: DeviceSpec, coeffs: Coefficients
) -> Coefficients:
    """``coeffs`` (a calibrated cluster's) with ``COMPUTE_FREE`` fitted to ``rows``, runs
    of ``profile``'s task on that cluster's device ``spec``."""
    return _fit(profile, rows, COMPUTE_FREE, lambda values: (spec, coeffs.fitted(values)))[1]


def measure(
    config: JobConfig,
    *,
    steps: int,
    seed: int = 0,
    warmup: int = 2,
    task: str = TASK,
    batch_size: int = BATCH,
    cluster: ClusterDescription | None = None,
) -> Measurement:
    """The median step time of ``task`` trained ``steps`` steps under ``config`` (after
    ``warmup`` steps), and the bytes it sent. On a described ``cluster``, also where its
    ranks ran (the ranks per machine, the slowest measured link between them) and, when
    they span machines, the synchronisation no rank hid."""
    from autotune.executor.runner import JobRunner, RunnerConfig

    run = RunnerConfig(task=task, steps=steps + warmup, batch_size=batch_size, seed=seed)
    result = JobRunner(run, config).run()
    times = result.step_times_s[warmup:]
    noise = result.summary()["noise_scale"]
    shape = None if cluster is None else _shape_on(cluster, [p["node"] for p in result.placement])
    sync = result.sync_times_s[warmup:]
    return Measurement(
        config,
        statistics.median(times),
        result.bytes_sent,
        shape=shape,
        batch=batch_size,
        sync_s=statistics.median(sync) if sync and shape and shape.nodes > 1 else None,
        noise_scale=noise,
    )


def task_statistics(rows: Sequence[Measurement]) -> dict[str, dict[str, Any]]:
    """What the calibration runs measured of their task's training: the median of the
    gradient noise scales they reported (runs of several replicas, enough steps), with
    the configurations it comes from; nothing where none reported one."""
    found = [(m.config.describe(), m.noise_scale) for m in rows if m.noise_scale is not None]
    if not found:
        return {}
    return {
        TASK: {
            "noise_scale": round(statistics.median(v for _, v in found), 3),
            "global_batch": BATCH,
            "measured_in": [name for name, _ in found],
        }
    }


def _shape_on(cluster: ClusterDescription, ray_nodes: Sequence[str]) -> Shape:
    """The shape of ranks on these nodes of ``cluster`` (by name or Ray node id): ranks
    per machine, and the slowest measured link of the machines used."""
    nodes = {
        key: n
        for n in cluster.with_measured_links().nodes
        for key in (n.node_id, n.backend_node_id)
        if key
    }
    unknown = sorted({r for r in ray_nodes if r not in nodes})
    if unknown:
        raise InputError(
            f"ranks ran on Ray nodes {', '.join(unknown)}, not in the cluster file: describe "
            "the cluster again (autotune cluster describe)"
        )
    counts = collections.Counter(ray_nodes)
    used = [nodes[r] for r in counts]
    return Shape(
        gpu_model=used[0].gpu_model,
        ranks_per_node=tuple(sorted(counts.values(), reverse=True)),
        inter_node_gbps=min(n.inter_node_bandwidth_gbps for n in used),
    )


LOCAL_STEPS = 20
"""Measured steps per configuration of a calibration on one machine (``autotune
calibrate``'s default there)."""
CLUSTER_STEPS = 60
"""Measured steps per configuration of a cluster calibration (``autotune calibrate
--cluster-file``'s default). Two 20-step calibrations of four testbed machines minutes
apart measured one configuration up to 40% apart (dense: 164 and 117 ms), where the
150-step runs of a benchmark agree within 3%; at 60 steps they were within 3-20%."""
LARGE_BATCH: int = 4 * BATCH
"""The calibration's second batch: a step's compute grows with its samples, its fixed
costs do not, and only two batches tell them apart."""


def link_grid(machines: int) -> tuple[JobConfig, ...]:
    """The six configurations a cluster is calibrated from, ``machines`` ranks each (one
    per machine where each has one CPU for ranks) unless said: dense in fp32 at the
    task's batch and at ``LARGE_BATCH``, int8, PowerSGD rank 4, top-k 1% in bf16, and
    tensor parallelism of 2 (data parallel over the other pairs of machines).

    At one batch the fit cannot tell a step's per-sample compute from its fixed overhead
    (it put the whole of gpt-char's compute into a per-step overhead, which then priced
    every other task's step and every batch alike); at two it can. bf16 and top-k share
    a run: the run's synchronisation is measured apart from its compute, so the first
    tells the device's 16-bit speed and the second the top-k reduction's cost, and the
    sixth run goes to a tensor-parallel group across machines, whose activation
    all-reduces pay a per-collective cost of their own (``TP_LATENCY``)."""
    if machines < 2:
        raise InputError("a cluster calibration needs at least 2 machines")
    dense = _config(dp=machines)
    return (
        dense,
        replace(dense, global_batch=LARGE_BATCH),
        _config(dp=machines, compression="int8"),
        replace(dense, compression=CompressionSpec(kind="powersgd", rank=4)),
        _config(dp=machines, compression="topk", precision="bf16"),
        _config(dp=machines // 2, tp=2),
    )


def compute_grid(task: str, machines: int) -> tuple[JobConfig, JobConfig]:
    """The runs a task's own compute is fitted from (``calibrate_compute``): plain data
    parallelism over ``machines`` ranks in fp32, at the task's batch and at 4x (two
    batches tell its per-sample compute from its per-step overhead)."""
    if machines < 2:
        raise InputError("a task's compute is calibrated on at least 2 machines")
    dense = _config(dp=machines)
    return dense, replace(dense, global_batch=4 * BUILTIN_TASKS[task].profile.reference_batch)


def calibrate_compute(
    task: str,
    report: Mapping[str, Any],
    *,
    cluster: ClusterDescription,
    steps: int = CLUSTER_STEPS,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fit ``task``'s own compute (``COMPUTE_FREE``) on a cluster the link ``report``
    (``calibrate``'s) calibrated, from its ``compute_grid`` runs over the cluster's
    machines (Ray must be connected). gpt-char's is the link calibration's own: one
    calibrated on the runs of a single task prices every other task's step with that
    task's per-step overhead (more than a whole step of mlp-synthetic here). Returns
    ``{"coefficients": the fitted values, "configs": each run, measured and fitted}``,
    which ``autotune.catalog.clusters.task_coefficients`` reads back."""
    if task not in BUILTIN_TASKS or BUILTIN_TASKS[task].trainer is None:
        raise InputError(f"task {task!r}: not a built-in task the executor trains")
    profile = BUILTIN_TASKS[task].profile
    spec, coeffs = calibration_profile(report)
    machines = sum(1 for n in cluster.nodes if n.cpu_milli > 0)
    rows = []
    for config in compute_grid(task, machines):
        if progress:
            progress(f"{task} {config.describe()}")
        rows.append(
            measure(
                config,
                steps=steps,
                seed=seed,
                task=task,
                batch_size=config.global_batch or profile.reference_batch,
                cluster=cluster,
            )
        )
    fitted = fit_compute(profile, rows, spec, coeffs)
    return {
        "coefficients": {p.name: getattr(fitted, p.name) for p in COMPUTE_FREE},
        "configs": [
            {
                "config": m.config.describe(),
                "measured_step_s": round(m.step_time_s, 5),
                "measured_sync_s": None if m.sync_s is None else round(m.sync_s, 5),
                "predicted_step_s": round(step_of(profile, m, spec, fitted).step_s, 5),
                "cluster_predicted_step_s": round(step_of(profile, m, spec, coeffs).step_s, 5),
            }
            for m in rows
        ],
        "steps": steps,
        "seed": seed,
    }


def calibrate(
    *,
    steps: int | None = None,
    seed: int = 0,
    grid: Sequence[JobConfig] = GRID,
    progress: Callable[[int, int, str], None] | None = None,
    cluster: ClusterDescription | None = None,
) -> dict[str, Any]:
    """Measure ``grid``, fit, and report (Ray must be connected). On a described
    ``cluster`` (its ranks on its machines) the fit is over ``LINK_FREE``: the links'
    latency and achieved bandwidth instead of a node's. ``steps``: measured per
    configuration (``None``: ``LOCAL_STEPS`` on one machine, ``CLUSTER_STEPS`` on a
    cluster)."""
    if steps is None:
        steps = LOCAL_STEPS if cluster is None else CLUSTER_STEPS
    profile = BUILTIN_TASKS[TASK].profile
    base = device("CPU")
    rows = []
    for i, config in enumerate(grid):
        if progress:
            progress(i, len(grid), config.describe())
        rows.append(
            measure(
                config,
                steps=steps,
                seed=seed,
                batch_size=config.global_batch or BATCH,
                cluster=cluster,
            )
        )
    if progress:
        progress(len(grid), len(grid), "fitting")

    def fitted(rows: Sequence[Measurement]) -> tuple[DeviceSpec, Coefficients]:
        return fit_profile(profile, rows, base, _FREE if cluster is None else link_free(rows))

    spec, coeffs = fitted(rows)
    measured = np.array([m.step_time_s for m in rows])
    predicted = _predict(profile, rows, spec, coeffs)
    held_out = []
    for i in range(len(rows)):
        rest = [m for j, m in enumerate(rows) if j != i]
        spec_i, coeffs_i = fitted(rest)
        held_out.append(float(_predict(profile, [rows[i]], spec_i, coeffs_i)[0]))
    held = np.array(held_out)
    return {
        "machine": {
            "node": platform.node(),
            "processor": platform.processor() or platform.machine(),
        },
        "cluster": None if cluster is None else cluster.source,
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
                "config": m.config.describe(),
                "ranks_per_machine": None if m.shape is None else list(m.shape.ranks_per_node),
                "measured_step_s": round(m.step_time_s, 5),
                "measured_sync_s": None if m.sync_s is None else round(m.sync_s, 5),
                "predicted_step_s": round(float(p), 5),
                "held_out_predicted_step_s": round(h, 5),
                "bytes_sent": m.bytes_sent,
            }
            for m, p, h in zip(rows, predicted, held, strict=True)
        ],
        "statistics": task_statistics(rows),
        "mape_step_time": round(mape(predicted, measured), 4),
        "mape_step_time_held_out": round(mape(held, measured), 4),
        "target_mape": 0.15,
    }


def save_profile(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)


def load_profile(path: str | Path) -> tuple[DeviceSpec, Coefficients]:
    """The calibrated device and coefficients saved by ``autotune calibrate``."""
    return calibration_profile(json.loads(Path(path).read_text()))
