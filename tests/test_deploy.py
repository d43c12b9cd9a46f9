"""The deployment files in ``deploy/`` name only settings the daemon has, probe routes the
API serves, and the command the package installs; what they cannot be checked for here
(a running systemd, Kubernetes, a Docker daemon) the README says."""

from __future__ import annotations

import configparser
import tomllib

import pytest
from helpers import REPO

from autotune.daemon.settings import Settings

DEPLOY = REPO / "deploy"


def _setting(name: str) -> bool:
    return name.removeprefix("AUTOTUNE_").lower() in Settings.model_fields


def test_the_systemd_unit_runs_the_daemon_and_waits_for_its_stop() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "systemd" / "autotune.service")
    service = unit["Service"]
    assert service["ExecStart"].endswith("/bin/autotune daemon")
    assert service["KillSignal"] == "SIGTERM"
    stop = Settings.model_fields["stop_timeout_s"].default
    assert float(service["TimeoutStopSec"]) > stop
    env = (DEPLOY / "systemd" / "autotune.env").read_text().splitlines()
    names = [line.split("=", 1)[0].lstrip("# ") for line in env if "=" in line]
    ours = [n for n in names if n.startswith("AUTOTUNE_")]
    assert ours
    assert [n for n in ours if not _setting(n)] == []


def test_the_kubernetes_manifest_names_real_settings_and_routes() -> None:
    yaml = pytest.importorskip("yaml")
    from autotune.api.app import create_app
    from autotune.db import Database

    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "autotune.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    # Two daemons: the lease holder decides, the other serves and stands by; the data
    # volume (checkpoints) is shared, so the next leader resumes the jobs.
    assert deployment["spec"]["replicas"] == 2
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert volumes[0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["autotune", "daemon"]
    names = [e["name"] for e in container["env"]]
    assert [n for n in names if not _setting(n)] == []
    app = create_app(db=Database("sqlite://"), telemetry="simulator")
    paths = set(app.openapi()["paths"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in paths
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_image_copies_every_package_folder() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = {p.split("/")[0] for p in pyproject["tool"]["setuptools"]["package-dir"].values()}
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert folders - {""} <= copied
