"""The shipped forecaster on the Helios virtual clusters it was not trained on.

For each unseen series, column and horizon: MAE of the LSTM, persistence and seasonal
naive, the LSTM/persistence MAE ratio, and the share of points whose value does not
change at all over the horizon (where persistence is exact).

    python bench/forecast.py [--helios ../shared/data/helios] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from autotune.policies.forecast import (
    default_checkpoint,
    evaluate_series,
    load_checkpoint,
    read_series,
)

COLUMNS = ("gpu_utilization", "pending_gpu_num")
HORIZONS = (15, 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parents[2] / "shared" / "data" / "helios"
    parser.add_argument("--helios", type=Path, default=here)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    forecaster = load_checkpoint(args.model or default_checkpoint())
    unseen = sorted(
        p
        for p in args.helios.glob("*.csv.gz")
        if p.name.removesuffix(".csv.gz") not in forecaster.config.trained_on
    )
    rows = []
    for path in unseen:
        for column in COLUMNS:
            series = read_series(path, column)
            for horizon in HORIZONS:
                result = evaluate_series(forecaster, series, horizon)
                v = series.values
                unchanged = float(np.mean(v[horizon:] == v[:-horizon]))
                rows.append({**result, "unchanged_share": unchanged})
    summary = {
        f"{c}@{h}": float(
            np.mean(
                [
                    r["mae_ratio_lstm_persistence"]
                    for r in rows
                    if r["column"] == c and r["horizon_min"] == h
                ]
            )
        )
        for c in COLUMNS
        for h in HORIZONS
    }
    report = {"trained_on": forecaster.config.trained_on, "rows": rows, "mean_ratio": summary}
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"{'series':14s} {'column':16s} {'h':>3s} {'LSTM':>9s} {'persist':>9s} {'seasonal':>9s}"
        f" {'ratio':>6s} {'unchanged':>9s}"
    )
    for r in rows:
        m = r["mae"]
        print(
            f"{r['series']:14s} {r['column']:16s} {r['horizon_min']:3d} {m['lstm']:9.5f} "
            f"{m['persistence']:9.5f} {m['seasonal_naive']:9.5f} "
            f"{r['mae_ratio_lstm_persistence']:6.3f} {r['unchanged_share']:9.1%}"
        )
    for key, value in summary.items():
        print(f"mean LSTM/persistence MAE ratio {key}: {value:.3f}")


if __name__ == "__main__":
    main()
