"""Joining or starting Ray, one way for everything that needs it: the executor's runs and
backend, policy training and search, and offline retraining.

Ray is imported only when a session is asked for, so ``import autotune`` stays light.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ensure_ray", "local_node_address"]


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
            node: dict[str, Any] = {}
            if (mine := local_node_address(address)) is not None:
                node["_node_ip_address"] = mine
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, **node)
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


def local_node_address(address: str) -> str | None:
    """The Ray node a driver of the cluster at ``address`` (``host:port``) belongs to,
    where this host runs several: the local raylet holding the address this host reaches
    the cluster from. ``None`` (Ray's own choice) where it runs one or none, or the
    address says no host.

    Ray attaches a driver to a raylet it finds among this host's processes, the head's
    first: right on a real cluster, where a host runs one node, but on a host that runs
    several in network namespaces (``autotune.benchmarks.testbed``) a driver on a worker
    would attach to the head's raylet, whose object store it cannot serve from."""
    import psutil

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))  # no packet is sent: a route is looked up
            mine = str(probe.getsockname()[0])
    except OSError:
        return None
    raylets: set[str] = set()
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info.get("cmdline") or []
        if argv and os.path.basename(argv[0]) == "raylet":
            raylets.update(a.split("=", 1)[1] for a in argv if a.startswith("--node_ip_address="))
    return mine if len(raylets) > 1 and mine in raylets else None
