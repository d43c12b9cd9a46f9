"""The daemon: the decision loop (``tick``) and its hosting beside the API (``hosting``),
the loop's health (``health``) and samples (``samples``), the leader lease (``leader``),
the policy registry's hand on the loop (``lifecycle``), each job's online throughput
model (``performance``), settings, auth, telemetry, logging, the demand forecast's
fallback and the registry of backends it can drive (``backends``).

The daemon asks the policy and stores and applies what the pure decision step
(``autotune.decision``) decides. Import the modules themselves
(``from autotune.daemon.tick import Daemon``): this package imports nothing, so the API
can read ``autotune.daemon.settings`` without the loop.
"""
