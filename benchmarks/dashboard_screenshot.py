"""A screenshot of the dashboard on a live daemon (`python bench/dashboard_screenshot.py`).

Starts ``autotune daemon`` on the built-in simulated cluster (its own seeded job stream)
with its data in a temporary directory, makes a registered version the shadow policy
(the rules, by default) so the policy panel compares two versions, lets it tick, pins a
running job through the API (``POST /api/v1/overrides``, with the token the daemon
printed), lets it tick again, and saves what headless Chromium draws of
``http://127.0.0.1:PORT/#decision=ID`` (the page opens the explanation of the decision
that honoured the override) as a PNG::

    python bench/dashboard_screenshot.py                     # docs/dashboard.png
    python bench/dashboard_screenshot.py --seconds 60 --out /tmp/dash.png

Needs ``chromium`` (Debian: ``apt-get install chromium``). Nothing outside the machine is
reached: the page loads Plotly from the daemon. Prints one JSON line: the file, its size,
the decision shown, the override created.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO

sys.path.insert(0, str(REPO / "tests"))
from helpers import (  # type: ignore[import-not-found]
    HEADLESS_CHROMIUM,
    Api,
    autotune_command,
    free_port,
)


def _wait(what: str, check: Any, timeout_s: float, daemon: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited ({daemon.returncode}) waiting for {what}")
        try:
            found = check()
        except (OSError, AssertionError, ValueError):  # not up yet: Api.get asserts 200
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def screenshot(
    browser: str, url: str, out: Path, window: str, budget_ms: int, timeout_s: float
) -> None:
    """What headless ``browser`` draws of ``url`` once ``budget_ms`` of virtual time passed
    (the page's reads answered and its plots drawn), saved as the PNG ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        done = subprocess.run(
            [
                browser,
                *HEADLESS_CHROMIUM,
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                f"--window-size={window}",
                f"--screenshot={out}",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "docs" / "dashboard.png",
        help="PNG to write (default: docs/dashboard.png in the repository)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="Wall seconds the daemon ticks before the screenshot (half before the "
        "override is created, half after; default 30)",
    )
    parser.add_argument(
        "--tick-s", type=float, default=0.5, help="Seconds between ticks (default 0.5)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        nargs=2,
        default=(8, 32),
        metavar=("INITIAL", "MAX"),
        help="The simulator's job stream: jobs at start, jobs in all (default 8 32)",
    )
    parser.add_argument(
        "--job-metrics-every-s",
        type=float,
        default=2.0,
        help="Seconds between two ticks that record each job's goodput "
        "(AUTOTUNE_JOB_METRICS_EVERY_S; the daemon's default, 30, leaves one or two "
        "points per job in a 30-second run; default 2)",
    )
    parser.add_argument(
        "--shadow",
        default="rules-0.1.0",
        help="Registered version to shadow beside the active (learned) policy; '' for "
        "none (default rules-0.1.0, registered by every daemon)",
    )
    parser.add_argument(
        "--provisioning",
        choices=("none", "buffer", "forecast"),
        default="none",
        help="The daemon's --provisioning: buffer or forecast park idle nodes (the map "
        "counts them); default none",
    )
    parser.add_argument(
        "--window-size", default="1400,1800", help="Chromium's window, WIDTH,HEIGHT"
    )
    parser.add_argument("--chromium", default=None, help="Browser (default: chromium on PATH)")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the temporary directory (data and logs)"
    )
    args = parser.parse_args(argv)

    browser = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        parser.error("chromium is not installed (Debian: apt-get install chromium)")
    root = Path(tempfile.mkdtemp(prefix="autotune-dashboard-"))
    port = free_port()
    env = {
        **os.environ,
        "AUTOTUNE_DATA_DIR": str(root / "data"),
        "AUTOTUNE_JOB_METRICS_EVERY_S": str(args.job_metrics_every_s),
    }
    for key in ("AUTOTUNE_DB_URL", "AUTOTUNE_CONFIG", "AUTOTUNE_TOKEN"):
        env.pop(key, None)
    stdout, stderr = root / "daemon.out", root / "daemon.err"
    api = Api(port)
    token: str | None = None
    started = time.monotonic()
    with stdout.open("w") as out, stderr.open("w") as err:
        daemon = subprocess.Popen(
            [
                *autotune_command(),
                "daemon",
                "--port",
                str(port),
                "--tick-s",
                str(args.tick_s),
                "--sim-initial-jobs",
                str(args.jobs[0]),
                "--sim-max-jobs",
                str(args.jobs[1]),
                "--provisioning",
                args.provisioning,
            ],
            cwd=root,
            env=env,
            stdout=out,
            stderr=err,
        )
    try:
        _wait("the API", lambda: api.get("/healthz")["status"] == "ok", 120, daemon)
        line = _wait(
            "the token line",
            lambda: next((ln for ln in stdout.read_text().splitlines() if "API token" in ln), None),
            30,
            daemon,
        )
        token = line.rsplit(" ", 1)[1]
        if args.shadow:
            status, body = api.call("POST", f"/policies/{args.shadow}/shadow", token=token)
            if status != 200:
                raise RuntimeError(f"shadowing {args.shadow}: {status} {body}")
        time.sleep(args.seconds / 2)
        running = _wait("a running job", lambda: api.get("/jobs?state=running")["data"], 60, daemon)
        job = running[0]["job_id"]
        status, override = api.call(
            "POST",
            "/overrides",
            {
                "job_id": job,
                "precision": {"ffn": "fp32"},
                "ttl_s": 3600,
                "reason": "keep the FFN in fp32 while the loss spikes are looked into",
            },
            token=token,
        )
        if status != 201:
            raise RuntimeError(f"creating the override: {status} {override}")
        pinned = time.monotonic()
        decision = _wait(
            "the override's decision",
            lambda: api.get(f"/decisions?job={job}&source=override")["data"],
            60,
            daemon,
        )[0]
        time.sleep(max(0.0, args.seconds / 2 - (time.monotonic() - pinned)))
        url = f"http://127.0.0.1:{port}/#decision={decision['id']}"
        screenshot(browser, url, args.out, args.window_size, budget_ms=8000, timeout_s=120)
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "out": str(args.out),
                "bytes": args.out.stat().st_size,
                "decision": decision["id"],
                "override": override["id"],
                "job": job,
                "seconds": round(time.monotonic() - started, 1),
                "data": str(root) if args.keep else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
