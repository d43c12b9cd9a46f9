"""The daemon: the tick loop (``loop``), overrides, explanations, settings, auth, telemetry,
logging, the load-forecast fallback and the registry of backends it can drive.

Import the modules themselves (``from autotune.daemon.loop import Daemon``): this package
imports nothing, so the API can read ``autotune.daemon.settings`` without the loop.
"""
