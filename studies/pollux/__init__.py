"""The Pollux-compatible world (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI'21; the artifact ``petuum/adaptdl``, branch
``osdi21-artifact``, folder ``simulator/``): Pollux's workloads played as Pollux's
simulator plays them, so that autotune's policies can be set beside Pollux's published
results.

- ``trace``: Pollux's simulator physics on the measured traces (``TraceApp``, the
  simulated cluster's ``JobPhysics``);
- ``env``: the world: its clock, its knobs, the jobs on their measured physics
  (``PolluxCompatEnv``);
- ``goodput``: a Pollux-style goodput optimiser and ``goodput-size``;
- ``optimus``: Optimus with its oracle, as the artifact runs it;
- ``oracle``: the oracle on the measured physics;
- ``learned``: the learned policy of this world: PPO's plug-in (``WORLD``) and serving;
- ``evaluate``: the policies side by side (``autotune pollux eval``);
- ``fit``: the performance model fitted to Pollux's measurements (``validate``,
  ``calibrate``); ``online_fit``: the online fit measured on Pollux's traces;
- ``protocol``: the held-out comparison with Pollux, job by job
  (``bench/pollux_learned.py``);
- ``cli``: ``autotune pollux eval``, ``train-policy``, ``validate-model`` and
  ``calibrate-model``.

The traces are read from a folder the caller names (``shared/data/pollux`` in the
repository's checkout); nothing of the artifact ships in the package but the fitted
coefficients in the catalog (``autotune.catalog.applications``).
"""
