"""``autotune plan`` on the Alibaba v2023 trace, and its answers to bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from helpers import autotune_command
from typer.testing import CliRunner

from autotune.cli import app
from autotune.envs.traces import load_nodes, load_pods
from autotune.planner import first_fit, verify_placements

runner = CliRunner()
POD_FILES = ("default", "gpushare40", "gpuspec33", "multigpu20")


def run_plan(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["plan", *args])
    return result.exit_code, result.stdout, result.stderr


def test_loaders_read_the_trace(alibaba_dir: Path) -> None:
    nodes = load_nodes(alibaba_dir / "openb_node_list_gpu_node.csv.gz")
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    assert {n.gpu_model for n in nodes} == {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}
    pods = load_pods(alibaba_dir / "openb_pod_list_gpuspec33.csv.gz")
    assert len(pods.jobs) + pods.skipped_cpu_only == 8152
    assert all(j.max_nodes == 1 for j in pods.jobs)
    assert [j.submitted_at for j in pods.jobs] == sorted(j.submitted_at for j in pods.jobs)
    constrained = [j for j in pods.jobs if j.gpu_types is not None]
    assert constrained
    assert all(
        set(j.gpu_types or ()) <= {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}
        for j in constrained
    )
    # The multi-GPU resampling has only the first five columns: file order, no types.
    multi = load_pods(alibaba_dir / "openb_pod_list_multigpu20.csv.gz", limit=50)
    assert len(multi.jobs) == 50
    assert all(j.gpu_types is None for j in multi.jobs)


@pytest.mark.parametrize("pods", POD_FILES)
def test_plan_json_on_the_first_pods_of_each_file(alibaba_dir: Path, pods: str) -> None:
    code, out, _ = run_plan(
        "--nodes",
        str(alibaba_dir / "openb_node_list_gpu_node.csv.gz"),
        "--jobs",
        str(alibaba_dir / f"openb_pod_list_{pods}.csv.gz"),
        "--limit",
        "400",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert set(report) >= {"assignments", "unplaced", "skipped_cpu_only", "solve_s"}
    assert report["skipped_cpu_only"] > 0
    jobs = {a["job"] for a in report["assignments"]} | {u["job"] for u in report["unplaced"]}
    assert len(jobs) == 400
    assert all(set(a) == {"job", "rank", "node", "gpu", "gpu_milli"} for a in report["assignments"])


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("pods", POD_FILES)
def test_whole_trace_places_at_least_as_many_pods_as_first_fit(
    alibaba_dir: Path, pods: str, tmp_path: Path
) -> None:
    nodes_path = alibaba_dir / "openb_node_list_gpu_node.csv.gz"
    pods_path = alibaba_dir / f"openb_pod_list_{pods}.csv.gz"
    # The real entry point, in its own process, as a user runs it.
    done = subprocess.run(
        [
            *autotune_command(),
            "plan",
            "--nodes",
            str(nodes_path),
            "--jobs",
            str(pods_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=tmp_path,
    )
    report = json.loads(done.stdout)
    nodes, trace = load_nodes(nodes_path), load_pods(pods_path)
    # Rebuild the placements from the printed assignment and check them independently.
    by_job: dict[str, list[dict[str, object]]] = {}
    for a in report["assignments"]:
        by_job.setdefault(str(a["job"]), []).append(a)
    specs = {j.job_id: j for j in trace.jobs}
    for job_id, ranks in by_job.items():
        assert len(ranks) == specs[job_id].min_gpus, f"{job_id}: gang broken"
        assert len({r["node"] for r in ranks}) == 1, f"{job_id}: pod spans nodes"
    from autotune.core import Placement, RankSlot

    placements = {
        job_id: Placement(
            job_id=job_id,
            ranks=tuple(
                RankSlot(
                    rank=int(r["rank"]),
                    node_id=str(r["node"]),
                    gpu_index=int(r["gpu"]),
                    gpu_milli=int(r["gpu_milli"]),
                )
                for r in ranks
            ),
        )
        for job_id, ranks in by_job.items()
    }
    assert verify_placements(trace.jobs, nodes, placements) == []
    baseline = first_fit(trace.jobs, nodes, {})
    assert len(by_job) >= len(baseline.placements)
    assert len(by_job) + len(report["unplaced"]) == len(trace.jobs)
    assert report["solve_s"] < 60


# --- bad input ------------------------------------------------------------------------


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,8000,16384,0,\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time\n"
    "p0,4000,8192,1,500,,10\np1,4000,8192,2,1000,T4,5\np2,1000,1024,0,0,,1\n"
)


def test_plan_on_small_files_places_in_creation_order(tmp_path: Path) -> None:
    nodes = write_gz(tmp_path / "nodes.csv.gz", NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    code, out, _ = run_plan("--nodes", str(nodes), "--jobs", str(tmp_path / "pods.csv"), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["skipped_cpu_only"] == 1
    # p1 (created first) takes both GPUs; p0 finds none left.
    assert {a["job"] for a in report["assignments"]} == {"p1"}
    assert [u["job"] for u in report["unplaced"]] == ["p0"]


@pytest.mark.parametrize(
    ("nodes_text", "pods_text", "expected"),
    [
        (None, PODS, "nodes.csv: file not found"),
        (
            NODES.replace("gpu,model", "gpus,model"),
            PODS,
            "nodes.csv: missing column(s) gpu; found sn, ",
        ),
        (
            NODES.replace("32000", "32k"),
            PODS,
            "nodes.csv, row 2, column 'cpu_milli': not an integer: '32k'",
        ),
        (
            NODES.replace("T4", "K80"),
            PODS,
            "nodes.csv, row 2, column 'model': unknown GPU model 'K80'",
        ),
        (NODES, PODS.replace(",1,500,", ",1,1500,"), "pods.csv, row 2, column 'gpu_milli'"),
        (
            NODES,
            PODS.replace("p1,4000,8192,2", "p1,4000,8192,x"),
            "pods.csv, row 3, column 'num_gpu': not an integer: 'x'",
        ),
        (
            NODES,
            PODS.replace("num_gpu,", ""),
            "pods.csv: missing column(s) num_gpu; found name, ",
        ),
        (
            NODES,
            PODS.replace(",5\n", ",-5\n"),
            "pods.csv, row 3, column 'creation_time': must be >= 0",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_file_row_column(
    tmp_path: Path, nodes_text: str | None, pods_text: str, expected: str
) -> None:
    nodes = tmp_path / "nodes.csv"
    if nodes_text is not None:
        nodes.write_text(nodes_text)
    pods = tmp_path / "pods.csv"
    pods.write_text(pods_text)
    code, out, err = run_plan("--nodes", str(nodes), "--jobs", str(pods), "--json")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert not list(tmp_path.glob("*.db")), "bad input must not create a database"


def test_gzip_that_is_not_gzip_is_a_clear_error(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv.gz"
    nodes.write_text(NODES)  # plain text under a .gz name
    pods = tmp_path / "pods.csv"
    pods.write_text(PODS)
    code, _, err = run_plan("--nodes", str(nodes), "--jobs", str(pods))
    assert code == 2
    assert err.startswith(f"error: {nodes}: cannot read as CSV")
