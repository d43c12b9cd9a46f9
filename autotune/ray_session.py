"""Joining or starting Ray, one way for everything that needs it: the executor's runs and
backend, policy training and search, and offline retraining.

Ray is imported only when a session is asked for, so ``import autotune`` stays light.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ensure_ray"]


@contextmanager
def _neutral_working_directory() -> Iterator[None]:
    """Ray puts the driver's working directory on every worker's ``sys.path``; started
    from a source checkout, its ``autotune/`` folder would shadow the installed package
    in the workers. Start Ray from the temporary directory instead."""
    here = os.getcwd()
    os.chdir(tempfile.gettempdir())
    try:
        yield
    finally:
        os.chdir(here)


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Connect to Ray: the cluster at ``address``, or a local one with at least
    ``num_cpus`` CPUs (the machine's where it has more). Returns whether this call
    started Ray (and so should shut it down); an already connected session is kept."""
    import ray

    if ray.is_initialized():
        return False
    with _neutral_working_directory():
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            cpus = max(num_cpus or 1, os.cpu_count() or 1)
            ray.init(
                # "local": a new Ray of this process's own, even where the address file of
                # a cluster started on this host (``ray start``) is found, running or not.
                address="local",
                num_cpus=cpus,
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
    return True
