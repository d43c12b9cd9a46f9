"""The demand forecaster on the Helios virtual clusters it was not trained on.

For each unseen cluster and horizon (15, 60 minutes), and over all their points
together: arrival probability (Brier score of the LSTM, calibrated persistence and
climatology; AUC; and, for reference, calibrated persistence refitted on the scored
cluster itself, an oracle) and the 95% quantile of peak demand (pinball loss in GPUs of the LSTM,
persistence + buffer and climatology; coverage). Scored on every minute from the second
day on, and on the later days only (``--later-from-day``, default 21: days the training
clusters held out for calibration).

    python bench/forecast.py [--helios ../shared/data/helios] [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autotune.policies.forecast import (
    default_checkpoint,
    load_checkpoint,
    pooled,
    read_demand,
    score_forecasts,
)


def _row(name: str, h: str, e: dict[str, Any]) -> str:
    lstm, pers, clim = e["lstm"], e["persistence"], e["climatology"]
    auc = f"{lstm['auc']:.3f} / {pers['auc']:.3f}" if "auc" in lstm else "-"
    refit = (
        f"{e['persistence_refit_brier'] / pers['brier']:.3f}"
        if "persistence_refit_brier" in e
        else "-"
    )
    return (
        f"| {name} | {h} | {lstm['brier']:.4f} | {pers['brier']:.4f} | {clim['brier']:.4f} | "
        f"**{e['brier_ratio']:.3f}** | {refit} | {auc} | {lstm['pinball']['0.95']:.3f} | "
        f"{pers['pinball']['0.95']:.3f} | {clim['pinball']['0.95']:.3f} | "
        f"**{e['pinball95_ratio']:.3f}** | {lstm['coverage']['0.95']:.1%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parents[2] / "shared" / "data" / "helios"
    parser.add_argument("--helios", type=Path, default=here)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--later-from-day", type=float, default=21.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    forecaster = load_checkpoint(args.model or default_checkpoint())
    unseen = sorted(
        p
        for p in args.helios.glob("*.csv.gz")
        if p.name.removesuffix(".csv.gz") not in forecaster.config.trained_on
    )
    series = [read_demand(p) for p in unseen]
    report: dict[str, Any] = {"trained_on": list(forecaster.config.trained_on)}
    for label, day in (("all_days", 1.0), ("later_days", args.later_from_day)):
        per = [score_forecasts(forecaster, s, from_day=day) for s in series]
        report[label] = {"from_day": day, "series": per, "pooled": pooled(per, (15, 60))}
    if args.json:
        print(json.dumps(report))
        return
    print(
        "| cluster | h (min) | Brier LSTM | Brier cal. persistence | Brier climatology | "
        "ratio | refitted persistence (oracle) / cal. persistence | "
        "AUC LSTM / cal. persistence | pinball95 LSTM | pinball95 persistence+buffer | "
        "pinball95 climatology | ratio | coverage95 LSTM |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label in ("all_days", "later_days"):
        part = report[label]
        suffix = "" if label == "all_days" else f" (from day {part['from_day'] + 1:g})"
        for r in part["series"]:
            for h, e in r["horizons"].items():
                print(_row(r["series"] + suffix, h, e))
        for h, e in part["pooled"].items():
            print(_row(f"all three{suffix}", h, e))


if __name__ == "__main__":
    main()
