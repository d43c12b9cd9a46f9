"""Which Ray node a driver attaches to where one host runs several (the testbed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from autotune.ray_session import local_node_address


def _raylets(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    procs = [
        SimpleNamespace(info={"cmdline": ["/x/raylet", f"--node_ip_address={a}", "--y=1"]})
        for a in addresses
    ] + [SimpleNamespace(info={"cmdline": ["python", "--node_ip_address=10.9.9.9"]})]

    def process_iter(_attrs: Any) -> list[SimpleNamespace]:
        return procs

    monkeypatch.setattr("psutil.process_iter", process_iter)


def test_with_several_raylets_on_the_host_the_driver_takes_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 127.0.0.1 reaches 127.0.0.1: the raylet holding it is this driver's node.
    _raylets(monkeypatch, "127.0.0.2", "127.0.0.1")
    assert local_node_address("127.0.0.1:6379") == "127.0.0.1"


def test_ray_chooses_where_the_host_runs_one_raylet_or_none_of_the_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _raylets(monkeypatch, "127.0.0.1")
    assert local_node_address("127.0.0.1:6379") is None
    _raylets(monkeypatch, "127.0.0.2", "127.0.0.3")
    assert local_node_address("127.0.0.1:6379") is None
    assert local_node_address("auto") is None
    assert local_node_address("ray://head") is None
