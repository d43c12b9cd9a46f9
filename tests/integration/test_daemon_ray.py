"""The daemon with ``--backend ray``: a job submitted through the API is trained for real
by the executor on a local Ray, placed where the daemon decided, and its measured step
figures come back through the API."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, Api, autotune_command, free_port, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]

TOKEN = "ray-backend-test-token"


def test_daemon_trains_a_submitted_job_on_ray(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "AUTOTUNE_DATA_DIR": str(tmp_path / "data"),
        "AUTOTUNE_TOKEN": TOKEN,
        # A LightningModule of the test data, its module allow-listed.
        "AUTOTUNE_TASK_MODULES": '["lightning_tasks"]',
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "data"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    for key in ("AUTOTUNE_DB_URL", "AUTOTUNE_CONFIG"):
        env.pop(key, None)
    with (tmp_path / "daemon.out").open("w") as out, (tmp_path / "daemon.err").open("w") as err:
        daemon = subprocess.Popen(
            [
                *autotune_command(),
                "daemon",
                "--backend",
                "ray",
                "--port",
                str(port),
                "--tick-s",
                "0.5",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=err,
        )
    api = Api(port)
    try:
        wait_for("the daemon", lambda: api.get("/healthz"), timeout_s=120)
        status, job = api.call(
            "POST",
            "/jobs",
            {"task": "gpt-char", "steps": 40, "global_batch": 16, "min_gpus": 2, "max_gpus": 2},
            token=TOKEN,
        )
        assert status == 201, job
        job_id = job["job_id"]

        def measured() -> dict[str, object] | None:
            shown = api.get(f"/jobs/{job_id}")
            metrics = shown["metrics"]
            return (
                shown
                if {"loss", "samples_per_s", "bytes_sent", "step_time_s"} <= set(metrics)
                else None
            )

        shown = wait_for("measured step metrics", measured, timeout_s=240)
        assert shown["metrics"]["samples_per_s"] > 0
        cluster = api.get("/cluster")
        assert cluster["telemetry"] == "ray"
        decisions = api.get(f"/decisions?job={job_id}")["data"]
        assert decisions, "no decision for the job"
        assert decisions[-1]["source"] == "policy"  # the learned policy, the default
        if decisions[-1]["config"]["layout"]["dp"] > 1:  # data-parallel ranks reduce
            assert shown["metrics"]["bytes_sent"] > 0
        placed = decisions[-1]["placement"]
        ray_node_ids = {node["node_id"] for node in cluster["nodes"]}
        assert {slot["node_id"] for slot in placed["ranks"]} <= ray_node_ids
        done = wait_for(
            "the job to finish",
            lambda: (j := api.get(f"/jobs/{job_id}"))["state"] == "finished" and j,
            timeout_s=240,
        )
        assert done["progress"] == 1.0
        assert done["metrics"]["loss"] < 5.5  # gpt-char starts at ln(256) = 5.55

        # Hugging Face models, named like built-in tasks, train on the same backend.
        hf_jobs = {}
        for task in ("hf:gpt2-tiny", "hf:llama-tiny", "hf:bert-tiny"):
            body = {"task": task, "steps": 12, "global_batch": 8, "min_gpus": 1, "max_gpus": 1}
            status, job = api.call("POST", "/jobs", body, token=TOKEN)
            assert status == 201, job
            hf_jobs[task] = job["job_id"]
        for task, job_id in hf_jobs.items():
            finished = wait_for(
                f"{task} to finish",
                lambda job_id=job_id: (
                    (j := api.get(f"/jobs/{job_id}"))["state"] == "finished" and j
                ),
                timeout_s=240,
            )
            metrics = finished["metrics"]
            assert metrics["samples_per_s"] > 0, task
            # 64 tokens per sample: each model's context.
            assert metrics["tokens_per_s"] == pytest.approx(64 * metrics["samples_per_s"]), task
            assert metrics["loss"] < 5.0, task  # from ln(256) = 5.55 (BERT: ln(260))

        status, job = api.call(
            "POST",
            "/jobs",
            {"task": "lightning:lightning_tasks:TeacherMLP", "steps": 12, "global_batch": 32},
            token=TOKEN,
        )
        assert status == 201, job
        lightning = wait_for(
            "the LightningModule to finish",
            lambda: (j := api.get(f"/jobs/{job['job_id']}"))["state"] == "finished" and j,
            timeout_s=240,
        )
        assert lightning["metrics"]["samples_per_s"] > 0
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)  # a clean stop shuts the daemon's Ray down
            try:
                daemon.wait(timeout=120)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
    assert daemon.returncode == 0, (tmp_path / "daemon.err").read_text()[-3000:]
