"""autotune: an autotuner and scheduler daemon for distributed deep-learning training.

Importing this package is cheap: it loads no Ray, RLlib or torch. The core types live in
``autotune.core`` and ``autotune.interfaces``, the Planner in ``autotune.planner``, the
pure decision step in ``autotune.decision``, the reinforcement-learning contract in
``autotune.rl``, the daemon in ``autotune.daemon.tick``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autotune")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
