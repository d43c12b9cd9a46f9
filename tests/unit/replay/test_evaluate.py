"""``autotune replay evaluate``: the counterfactual simulation and the off-policy estimates
side by side, and a verdict that promotes only what both support."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import autotune_command

from autotune.daemon.tick import Daemon
from autotune.envs.workloads import load_workload
from autotune.errors import InputError
from autotune.policies.replay.evaluate import evaluate_replay, parse_policy, verdicts
from autotune.policies.serving import default_policy_checkpoint


@pytest.fixture(scope="module")
def copy_of_shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logging policy under another name (same weights, same content hash)."""
    path = tmp_path_factory.mktemp("policies") / "same"
    shutil.copytree(default_policy_checkpoint(), path)
    return path


def test_the_logging_policy_against_itself_is_not_promoted_and_its_estimate_is_the_logged_mean(
    logged_export: tuple[str, Path, Daemon], copy_of_shipped: Path
) -> None:
    _, out, _ = logged_export
    nodes, arrivals, round_s = load_workload(out)
    # Four of the logged jobs, each a hundredth as long: a few rounds of simulation.
    short = [replace(a, work=a.work / 100) for a in arrivals[:4]]
    report = evaluate_replay(
        out,
        [parse_policy("shipped"), parse_policy(f"same={copy_of_shipped}")],
        workload=(nodes, short, round_s),
        seeds=2,
        resamples=300,
    )
    ope = report["off_policy"]
    same = ope["policies"]["same"]
    # The logging policy's probabilities reproduce every logged one...
    assert same["logging_mismatch_share"] == 0.0
    assert same["ess_share"] == pytest.approx(1.0)
    # ...so self-normalised importance sampling gives the logged mean, and the doubly
    # robust interval contains it.
    assert same["snis"]["candidate"]["value"] == pytest.approx(ope["logged_mean_reward"])
    assert same["dr"]["candidate"]["low"] <= ope["logged_mean_reward"]
    assert ope["logged_mean_reward"] <= same["dr"]["candidate"]["high"]
    # Same seeds, same policy: the simulation gives identical runs.
    cf = report["counterfactual"]["policies"]
    assert cf["same"]["per_seed"] == cf["shipped"]["per_seed"]
    assert cf["same"]["vs_baseline"]["goodput"]["mean"] == 0.0
    verdict = report["verdicts"]["same"]
    assert not verdict["promote"]
    assert len(verdict["failed"]) == 3  # counterfactual, SNIS and DR bounds at 0
    json.dumps(report, allow_nan=False)


def test_the_verdict_names_every_failed_test() -> None:
    cf = {
        "baseline": "a",
        "policies": {
            "a": {},
            "b": {"vs_baseline": {"goodput": {"low": 0.4}, "avg_jct_s": {"high": 10.0}}},
        },
    }
    good = {"verdict": {"promote": True, "failed": []}}
    assert verdicts(cf, {"logging": "a", "policies": {"b": good}}) == {
        "b": {"promote": True, "failed": []}
    }
    bad_ope = {"verdict": {"promote": False, "failed": ["ESS 5.0% of the rows, below 10%"]}}
    cf["policies"]["b"]["vs_baseline"]["goodput"]["low"] = -0.1
    result = verdicts(cf, {"logging": "a", "policies": {"b": bad_ope}})["b"]
    assert not result["promote"]
    assert result["failed"][0].startswith("counterfactual: neither the goodput gain")
    # A shorter average JCT in every seed is a counterfactual gain too.
    cf["policies"]["b"]["vs_baseline"]["avg_jct_s"]["high"] = -5.0
    assert verdicts(cf, {"logging": "a", "policies": {"b": good}})["b"]["promote"]
    assert result["failed"][1] == "off-policy: ESS 5.0% of the rows, below 10%"


def test_bad_policies_are_refused(tmp_path: Path, logged_export: tuple[str, Path, Daemon]) -> None:
    _, out, _ = logged_export
    with pytest.raises(InputError, match="no policy checkpoint"):
        parse_policy(str(tmp_path / "absent"))
    with pytest.raises(InputError, match="at least one candidate"):
        evaluate_replay(out, [parse_policy("shipped")])
    with pytest.raises(InputError, match="logging policy and must be a checkpoint"):
        evaluate_replay(out, [parse_policy("rules"), parse_policy("shipped")], seeds=1)


@pytest.mark.subprocess
def test_the_command_prints_json_and_exits_2_on_bad_input(
    tmp_path: Path, logged_export: tuple[str, Path, Daemon]
) -> None:
    _, out, _ = logged_export
    bad = subprocess.run(
        [*autotune_command(), "replay", "evaluate", "--data", str(out), "--policy", "shipped"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "at least one candidate" in bad.stderr
    export = subprocess.run(
        [
            *autotune_command(),
            "replay",
            "export",
            "--db",
            "sqlite:///" + str(tmp_path / "x.db"),
            "--out",
            str(tmp_path / "e"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert export.returncode == 2
    assert "no database here" in export.stderr
