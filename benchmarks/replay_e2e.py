"""Learning from logged runs, end to end, through the command line, timed.

1. ``autotune daemon`` on the simulated cluster with the shipped policy plays the first
   half of a Pollux workload (``--first``; exploration at its default) and logs its rounds;
2. ``autotune replay export`` writes them as Parquet;
3. ``autotune replay train`` retrains (``--algo``, ``--sim-finetune`` PPO iterations on the
   replayed workload);
4. ``autotune replay evaluate`` sets the retrained policy beside the logging one: by
   counterfactual simulation on the workload's second half (``--second``) and by
   off-policy estimates on the logged rows;
5. against the daemon still running, with jobs submitted to it: ``autotune policy
   register``, ``shadow`` for a few ticks, ``activate`` (a decision carries the new
   version), ``rollback`` (the shipped version is active again).

Prints one JSON object (and writes it to ``--json-out``): seconds per step and in all,
the counterfactual figures and the relative change, the off-policy differences, whether
their signs agree, the verdict, and what the lifecycle steps answered. Goals: all of it
within 20 minutes on 2 cores; the retrained policy 5% better in average JCT or goodput,
the off-policy estimate agreeing in sign.

    python bench/replay_e2e.py --workload ../shared/data/pollux/workloads/workload-2.csv \\
        --sim-finetune 40 --out runs/replay_e2e --json-out bench/out/replay_e2e.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def _autotune() -> list[str]:
    script = Path(sys.executable).parent / "autotune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "autotune.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Run:
    """Runs ``autotune`` commands against one daemon, timing each."""

    def __init__(self, out: Path, port: int, token: str) -> None:
        self.out = out
        self.url = f"http://127.0.0.1:{port}"
        self.env = {
            **os.environ,
            "AUTOTUNE_TOKEN": token,
            "AUTOTUNE_URL": self.url,
            "AUTOTUNE_DATA_DIR": str(out / "data"),
        }
        self.seconds: dict[str, float] = {}

    def cli(self, step: str, *args: str) -> Any:
        began = time.perf_counter()
        done = subprocess.run(
            [*_autotune(), *args, "--json"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            cwd=self.out,
        )
        self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - began
        if done.returncode != 0:
            raise SystemExit(f"{step}: exit {done.returncode}: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + "/api/v1" + path, timeout=10) as response:
            return json.loads(response.read())


def _wait(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, required=True, help="A Pollux workload CSV.")
    parser.add_argument("--first", default="0:80", help="Jobs the daemon logs (START:STOP).")
    parser.add_argument("--second", default="80:160", help="Jobs evaluated on.")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--algo", default="marwil")
    parser.add_argument("--sim-finetune", type=int, default=40)
    parser.add_argument("--sim-teacher", default=None, help="e.g. oracle (see replay train)")
    parser.add_argument("--sim-teacher-episodes", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tick-s", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=Path("runs/replay_e2e"))
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)

    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    (out / "data").mkdir(parents=True)
    workload = args.workload.resolve()
    first_jobs = int(args.first.split(":")[1] or 0) - int(args.first.split(":")[0] or 0)
    port = _free_port()
    run = Run(out, port, secrets.token_urlsafe(16))
    db = f"sqlite:///{out / 'daemon.db'}"
    began = time.perf_counter()
    daemon = subprocess.Popen(
        [
            *_autotune(),
            "daemon",
            "--db",
            db,
            "--port",
            str(port),
            "--tick-s",
            str(args.tick_s),
            "--sim-workload",
            str(workload),
            "--sim-workload-jobs",
            args.first,
            "--sim-gpus",
            str(args.gpus),
        ],
        env=run.env,
        stdout=(out / "daemon.out").open("w"),
        stderr=(out / "daemon.log").open("w"),
        cwd=out,
    )
    report: dict[str, Any] = {
        "workload": workload.name,
        "first": args.first,
        "second": args.second,
        "algo": args.algo,
        "sim_finetune": args.sim_finetune,
        "sim_teacher": args.sim_teacher,
        "gpus": args.gpus,
        "seeds": args.seeds,
    }
    try:
        _wait("the API", lambda: run.get("/healthz")["status"] == "ok", 60)
        _wait(
            "the first half to finish",
            lambda: run.get("/cluster")["jobs"].get("finished", 0) >= first_jobs,
            600,
        )
        run.seconds["daemon_first_half"] = time.perf_counter() - began
        shipped = run.get("/policies/active")["version"]
        report["logging_policy"] = shipped

        report["export"] = run.cli("export", "replay", "export", "--db", db, "--out", "logs")
        trained = run.cli(
            "train",
            "replay",
            "train",
            "--data",
            "logs",
            "--algo",
            args.algo,
            "--sim-finetune",
            str(args.sim_finetune),
            *(
                [
                    "--sim-teacher",
                    args.sim_teacher,
                    "--sim-teacher-episodes",
                    str(args.sim_teacher_episodes),
                ]
                if args.sim_teacher
                else []
            ),
            "--out",
            "retrained",
        )
        report["train"] = {
            key: trained.get(key) for key in ("version", "agreement", "seconds", "returns")
        }
        simulated = trained.get("sim_finetune") or {}
        report["train"]["simulator_returns"] = [
            round(row["episode_return_mean"], 2) for row in simulated.get("history", [])
        ]
        evaluated = run.cli(
            "evaluate",
            "replay",
            "evaluate",
            "--data",
            "logs",
            "--pollux-workload",
            str(workload),
            "--workload-jobs",
            args.second,
            "--gpus",
            str(args.gpus),
            "--seeds",
            str(args.seeds),
            "--policy",
            "shipped",
            "--policy",
            "retrained=retrained",
        )
        cf = evaluated["counterfactual"]["policies"]
        ope = evaluated["off_policy"]["policies"]["retrained"]
        relative = cf["retrained"]["relative"]
        improvement = max(-relative["avg_jct"], relative["goodput"])
        report["counterfactual"] = {
            name: {key: cf[name][key]["mean"] for key in ("avg_jct_s", "goodput", "energy_kwh")}
            for name in cf
        }
        report["relative"] = relative
        report["off_policy"] = {
            "snis_difference": ope["snis"]["difference"],
            "dr_difference": ope["dr"]["difference"],
            "ess_share": ope["ess_share"],
            "clipped_share": ope["clipped_share"],
            "rows": ope["rows"],
        }
        report["verdict"] = evaluated["verdicts"]["retrained"]
        sign = 1 if improvement > 0 else -1
        report["goal_improvement_5pct"] = improvement >= 0.05
        report["goal_signs_agree"] = all(
            (ope[estimate]["difference"]["value"] or 0) * sign > 0 for estimate in ("snis", "dr")
        )

        # The lifecycle against the running daemon, with jobs for it to decide.
        for i, (task, gpus) in enumerate([("cifar10", 4), ("bert", 8), ("imagenet", 8)] * 2):
            run.cli(
                "submit",
                "job",
                "submit",
                task,
                "--id",
                f"late-{i}",
                "--steps",
                "200000",
                "--batch",
                "128",
                "--max-gpus",
                str(gpus),
            )
        registered = run.cli(
            "register",
            "policy",
            "register",
            str(out / "retrained"),
            "--name",
            "retrained",
            "--kind",
            args.algo,
        )
        version = registered["version"]
        run.cli("shadow", "policy", "shadow", version)
        _wait(
            "shadow ticks",
            lambda: (run.get("/policies/shadow").get("ticks") or 0) >= 10,
            120,
        )
        report["shadow"] = run.cli("shadow_status", "policy", "shadow")
        run.cli("activate", "policy", "activate", version)
        run.cli(
            "submit",
            "job",
            "submit",
            "ncf",
            "--id",
            "after-activation",
            "--steps",
            "50000",
            "--batch",
            "128",
            "--max-gpus",
            "2",
        )
        decided = _wait(
            "a decision by the activated version",
            lambda: run.get(f"/decisions?policy_version={version}&limit=1")["data"],
            120,
        )
        report["activated"] = {"version": version, "decision": decided[0]["id"]}
        run.cli("rollback", "policy", "rollback")
        active = _wait(
            "the rollback",
            lambda: (a := run.get("/policies/active")["version"]) == shipped and a,
            60,
        )
        report["rolled_back_to"] = active
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
    report["seconds"] = {k: round(v, 1) for k, v in run.seconds.items()}
    report["seconds"]["total"] = round(time.perf_counter() - began, 1)
    report["goal_within_20_min"] = report["seconds"]["total"] <= 1200
    text = json.dumps(report)
    print(text)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
