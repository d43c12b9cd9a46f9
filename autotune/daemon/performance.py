"""Each job's throughput model, learned online from its own measured steps.

Pollux's agent idea: the scheduler needs no profile in advance, because every running
job's performance-model coefficients are refitted from the steps it measures
(``autotune.perf.online.OnlineFit``), starting from the catalog's coefficients for its
model as a prior. The daemon feeds ``JobModels`` every tick from the backend's step
metrics (``step_time_s``, and ``sync_time_s`` where measured): the Ray backend's
``job_*`` measurements of real training, the simulated cluster's noisy simulated ones.
Once a job has enough distinct points (configurations, placements or batches), the
decision step's explanations predict its goodput with the fitted model and say so;
until then with the catalog's, saying that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.catalog.applications import catalog_coefficients
from autotune.core import NodeInfo
from autotune.interfaces import ClusterSnapshot
from autotune.perf.model import shape_of
from autotune.perf.online import MIN_POINTS, JobModel, OnlineFit, StepSample

__all__ = ["JobModels"]


class JobModels:
    """The online fits of the active jobs; see the module docstring."""

    def __init__(self, *, min_points: int = MIN_POINTS) -> None:
        self._fits: dict[str, OnlineFit] = {}
        self._min_points = min_points
        self._summaries: dict[str, dict[str, Any]] = {}
        # Per running job: (config, placement, progress) when last seen. A step time
        # counts only once the job has trained on, as it runs now, since then: a backend
        # keeps reporting the previous configuration's step until the new one's first
        # step (through checkpoint, restart and set-up), and a step longer than a tick is
        # reported on several ticks.
        self._seen: dict[str, tuple[object, object, float]] = {}

    def observe(self, snapshot: ClusterSnapshot) -> list[str]:
        """Feed the running jobs' latest measured steps; forget ended jobs. Returns the
        jobs whose summary changed (a new point, a refit)."""
        nodes: Mapping[str, NodeInfo] = {n.node_id: n for n in snapshot.nodes}
        active = {j.spec.job_id for j in snapshot.jobs if j.state in ("pending", "running")}
        for job_id in [k for k in self._fits if k not in active]:
            del self._fits[job_id]
            self._summaries.pop(job_id, None)
        running = {j.spec.job_id for j in snapshot.by_state("running")}
        for job_id in [k for k in self._seen if k not in running]:
            del self._seen[job_id]
        changed: list[str] = []
        for job in snapshot.by_state("running"):
            step_s = job.metrics.step_time_s
            spec = job.spec
            now = (job.config, job.placement, job.progress)
            before = self._seen.get(spec.job_id)
            self._seen[spec.job_id] = now
            if before is None or before[:2] != now[:2] or before[2] == now[2]:
                continue
            if (
                step_s is None
                or not step_s > 0
                or spec.model is None
                or job.config is None
                or job.placement is None
                or any(slot.node_id not in nodes for slot in job.placement.ranks)
            ):
                continue
            shape = shape_of(job.placement, nodes)
            fit = self._fits.get(spec.job_id)
            if fit is None:
                prior = catalog_coefficients(spec.model, shape.gpu_model)
                fit = self._fits[spec.job_id] = OnlineFit(
                    spec.model, prior, min_points=self._min_points
                )
            sync = job.metrics.sync_time_s
            fit.add(
                StepSample(
                    shape=shape,
                    config=job.config,
                    global_batch=job.config.batch(spec),
                    step_s=float(step_s),
                    sync_s=None if sync is None else float(sync),
                )
            )
            summary = fit.summary()
            if summary != self._summaries.get(spec.job_id):
                self._summaries[spec.job_id] = summary
                changed.append(spec.job_id)
        return changed

    def summary(self, job_id: str) -> dict[str, Any] | None:
        """What the API shows: points, whether fitted, fit error, coefficients, source."""
        return self._summaries.get(job_id)

    def current(self) -> dict[str, JobModel]:
        """Per job with a fit: the model the decision step predicts it with."""
        out: dict[str, JobModel] = {}
        for job_id, fit in self._fits.items():
            fitted = fit.fitted
            out[job_id] = JobModel(
                coefficients=fit.coefficients,
                source="online" if fitted else "catalog",
                points=fit.points,
                fit_error=fit.fit_error,
            )
        return out
