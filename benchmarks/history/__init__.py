"""A month of the daemon's history in a database (`python bench/history.py`).

Builds the database ``autotune daemon`` would leave after ``--days`` of deciding for a
cluster of ``--cluster-gpus`` GPUs, so that the daemon and the API can be measured on a
month-old database rather than an empty one::

    python bench/history.py --days 30 --out /work/runs/history30.db
    python bench/history.py --db postgresql+psycopg://me@db/autotune --days 7

The database is created with ``Database(url).upgrade()`` and everything is written
through ``autotune.db.repository`` (the functions the daemon and the API call), with
the history's own times:

- **cluster**: 8-GPU A100 nodes, the ``NodeInfo`` of the built-in simulated cluster
  (``autotune.envs.presets.default_nodes``) under the names ``a100-0``, ``a100-1``, ...;
- **jobs** arrive as the daemon's built-in job stream (``job_stream``: Poisson, catalog
  models) at the rate that gives ``--decisions-per-day``; each wants a power of two of
  GPUs within its bounds (small ones more often), waits for them (first come, the first
  32 in the queue considered, smaller where its wish does not fit), runs for a
  log-normal time (its steps follow from the performance model's goodput) sized so
  that jobs at the sizes they ask for would keep 75 % of the GPUs busy (restarts,
  smaller placements and the policy's slower configurations make it about 95 %), is
  resized now and then, and ends finished (92 %), failed (3 %) or cancelled (5 %).
  Jobs still active when the history ends are cancelled then: a daemon started on the
  database afterwards resumes nothing;
- **decisions** are the decision step's own output (``autotune.decision.step.decide``:
  memory rule, Planner, ``explain_decision``), computed once at start for every
  (model, GPU count) of the stream and reused as templates with each decision's job,
  placement, live features and reason. ``policy``: the learned policy's wording
  (``ppo (slot k): chosen|reconfigured ...``) on actions sampled from its action space
  (``decode_slot``; the network is not loaded), at start, on resizes (paced so the
  total meets ``--decisions-per-day``) and when an override ends; ``override``: 3 % of
  jobs get a user's pin while running (a third are deleted early where the job still
  runs then, the others expire);
  ``fallback``: a few episodes where the rules decided after failed ticks, as the
  daemon does. Policy versions as the daemon registers them (``ppo-<version>`` active,
  ``rules-<version>`` its fallback);
- **metrics**: every ``--cluster-metrics-every`` ticks the four samples the daemon
  records each tick (``tick_duration_s``, ``jobs_running``, ``jobs_pending``,
  ``gpu_utilization``), and every ``--job-metrics-every`` ticks, in the same call, each
  running job's ``job_goodput``, ``job_nan_events``, ``job_power_watts`` and
  ``job_step_time_s`` (what the simulated backend measures);
- **transitions**: one for about every 200 policy decisions (a logged round of the
  learned policy as the daemon writes it).

A 30-day build at the defaults holds 105 k jobs, 1.05 M decisions and 3.9 M metric
samples: 3.1 GB of SQLite, written in about 6 minutes on 2 shared cores. Prints one JSON
object (rows per table, file size for SQLite, seconds taken) and writes it to
``bench/out/history.json`` (``--json-out``). ``build_history`` does the same from Python.
"""

from autotune.benchmarks.history.build import build_history, database_bytes, main
from autotune.benchmarks.history.settings import (
    DEFAULT_CLUSTER_METRICS_EVERY,
    DEFAULT_DAYS,
    DEFAULT_DECISIONS_PER_DAY,
    DEFAULT_GPUS,
    DEFAULT_JOB_METRICS_EVERY,
    DEFAULT_TICK_S,
    cluster_nodes,
)

__all__ = [
    "DEFAULT_CLUSTER_METRICS_EVERY",
    "DEFAULT_DAYS",
    "DEFAULT_DECISIONS_PER_DAY",
    "DEFAULT_GPUS",
    "DEFAULT_JOB_METRICS_EVERY",
    "DEFAULT_TICK_S",
    "build_history",
    "cluster_nodes",
    "database_bytes",
    "main",
]
