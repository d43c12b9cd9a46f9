"""``GET /api/v1/forecast`` and the dashboard's GPU demand panel over demand written through
the repository, forecast by stub forecasters with known numbers: the minutes of the window,
the forecast made at each of them, the band aligned at the end of the window it
forecasts, the coverage and arrival arithmetic, and the fallback along the chain."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from autotune.api.app import create_app
from autotune.db import Database
from autotune.db import repository as repo
from autotune.demand import DemandForecaster
from autotune.errors import InputError

F64 = Any
MINUTES = 180
P_ARRIVAL = {15: 0.25, 60: 0.5}
BUFFER = {15: (1.0, 2.0, 3.0), 60: (2.0, 4.0, 6.0)}
"""The stub's peak quantiles: the demand at the minute made plus these (q50, q90, q95)."""


class Stub:
    """Deterministic: the arrival probability of ``P_ARRIVAL``, the peak quantiles the
    demand at the minute made plus ``BUFFER``."""

    name = "stub"
    history = 1

    def predict(
        self, demand: F64, capacity: float, ends: F64, week_minute: F64, origin: int = 0
    ) -> tuple[F64, F64]:
        now = demand[ends]
        prob = np.column_stack([np.full(len(ends), P_ARRIVAL[h]) for h in (15, 60)])
        buffer = np.array([BUFFER[15], BUFFER[60]])
        return prob, now[:, None, None] + buffer[None, :, :]


class Broken:
    name = "broken"
    history = 1

    def predict(self, *args: Any, **kwargs: Any) -> tuple[F64, F64]:
        raise RuntimeError("no weights")


class NotFinite(Stub):
    name = "nan"

    def predict(self, *args: Any, **kwargs: Any) -> tuple[F64, F64]:
        prob, peak = super().predict(*args, **kwargs)
        return prob * np.nan, peak


def demand_at(k: int) -> float:
    """Minute ``k``: 4 GPUs, 6 every other half hour, 5 more every 37th minute."""
    return (4.0 if (k // 30) % 2 == 0 else 6.0) + (5.0 if k % 37 == 36 else 0.0)


def _start() -> datetime:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return now - timedelta(minutes=MINUTES)


def write(database: Database, start: datetime, values: Sequence[float], every_min: int = 1) -> None:
    """One tick per ``every_min`` minutes, 20 s into its minute: demand and capacity (32
    GPUs, then 36 for the second half)."""
    with database.session() as session:
        for k, value in enumerate(values):
            capacity = 32.0 if k < len(values) // 2 else 36.0
            repo.record_metrics(
                session=session,
                values=[("gpu_demand", value, None), ("gpu_capacity", capacity, None)],
                at=start + timedelta(minutes=k * every_min, seconds=20),
            )


def client_with(database: Database, forecasters: Sequence[DemandForecaster]) -> TestClient:
    return TestClient(create_app(db=database, telemetry="simulator", forecasters=forecasters))


def expected(values: list[float], h: int) -> tuple[int, float, float, float]:
    """(passed windows, share whose peak stayed <= q95, arrival rate, mean p) over
    ``values``, computed here from the definitions."""
    n = len(values)
    covered = arrived = 0
    passed = 0
    for i in range(n):
        if i + h > n - 1:
            continue
        passed += 1
        peak = max(values[i + 1 : i + h + 1])
        covered += peak <= values[i] + BUFFER[h][2]
        arrived += any(values[j + 1] > values[j] for j in range(i, i + h))
    return passed, covered / passed, arrived / passed, P_ARRIVAL[h]


@pytest.fixture
def written(database: Database) -> tuple[Database, datetime, list[float]]:
    start = _start()
    values = [demand_at(k) for k in range(MINUTES)]
    write(database, start, values)
    return database, start, values


def test_the_forecast_shows_each_minute_with_the_forecast_made_at_it(
    written: tuple[Database, datetime, list[float]],
) -> None:
    database, start, values = written
    with client_with(database, [Stub()]) as client:
        body = client.get("/api/v1/forecast", params={"minutes": 120}).json()
    shown = values[-120:]
    assert body["predictor"] == "stub"
    assert body["fallback_reasons"] == []
    assert body["minutes"] == 120
    assert body["truncated"] is False
    assert body["capacity_gpus"] == 36.0
    points = body["points"]
    assert [p["demand_gpus"] for p in points] == shown
    first = start + timedelta(minutes=MINUTES - 120)
    assert [datetime.fromisoformat(p["at"]) for p in points] == [
        first + timedelta(minutes=i) for i in range(120)
    ]
    for point, value in zip(points, shown, strict=True):
        for h in (15, 60):
            made = point["forecast"][str(h)]
            assert made["p_arrival"] == P_ARRIVAL[h]
            assert [made["q50"], made["q90"], made["q95"]] == [value + b for b in BUFFER[h]]
    assert body["now"] == points[-1]["forecast"]
    for h in (15, 60):
        windows, coverage, rate, mean_p = expected(shown, h)
        assert windows == 120 - h
        assert body["coverage95"][str(h)] == pytest.approx(coverage)
        assert body["arrivals"][str(h)] == {
            "windows": windows,
            "observed_rate": pytest.approx(rate),
            "mean_p_arrival": pytest.approx(mean_p),
        }
    # The numbers test something: some peaks escape the stub's q95, some windows see
    # no arrival.
    assert 0 < body["coverage95"]["15"] < 1
    assert 0 < body["arrivals"]["15"]["observed_rate"] < 1


def test_a_window_shorter_than_the_horizon_has_nothing_passed(
    written: tuple[Database, datetime, list[float]],
) -> None:
    database, _start_at, values = written
    with client_with(database, [Stub()]) as client:
        body = client.get("/api/v1/forecast", params={"minutes": 10}).json()
    assert [p["demand_gpus"] for p in body["points"]] == values[-10:]
    assert body["coverage95"] == {"15": None, "60": None}
    assert body["arrivals"]["60"] == {"windows": 0, "observed_rate": None, "mean_p_arrival": None}


def test_the_samples_cap_cuts_the_window_to_the_newest_ticks(
    written: tuple[Database, datetime, list[float]],
) -> None:
    database, _start_at, values = written
    with client_with(database, [Stub()]) as client:
        body = client.get("/api/v1/forecast", params={"minutes": 120, "samples": 50}).json()
        assert client.get("/api/v1/forecast", params={"minutes": 0}).status_code == 422
        assert client.get("/api/v1/forecast", params={"minutes": 10081}).status_code == 422
    assert body["truncated"] is True
    assert [p["demand_gpus"] for p in body["points"]] == values[-50:]


def test_minutes_between_ticks_hold_the_tick_before(database: Database) -> None:
    start = _start()
    write(database, start, [2.0, 8.0, 5.0], every_min=5)
    with client_with(database, [Stub()]) as client:
        body = client.get("/api/v1/forecast", params={"minutes": 60}).json()
    assert [p["demand_gpus"] for p in body["points"]] == [2.0] * 5 + [8.0] * 5 + [5.0]
    ats = [datetime.fromisoformat(p["at"]) for p in body["points"]]
    assert ats == [start + timedelta(minutes=i) for i in range(11)]


def test_a_failing_forecaster_hands_over_to_the_next_and_says_why(
    written: tuple[Database, datetime, list[float]],
) -> None:
    database, _start_at, values = written
    with client_with(database, [Broken(), NotFinite(), Stub()]) as client:
        body = client.get("/api/v1/forecast", params={"minutes": 30}).json()
    assert body["predictor"] == "stub"
    assert body["fallback_reasons"] == [
        "broken: RuntimeError: no weights",
        "nan: not a finite forecast",
    ]
    assert body["now"]["15"]["q95"] == values[-1] + BUFFER[15][2]
    with client_with(database, [Broken()]) as client:
        body = client.get("/api/v1/forecast", params={"minutes": 30}).json()
    # NoForecast is the last resort: no arrival expected, the peak is the demand now.
    assert body["predictor"] == "none"
    assert body["fallback_reasons"] == ["broken: RuntimeError: no weights"]
    assert body["now"]["60"] == {
        "p_arrival": 0.0,
        "q50": values[-1],
        "q90": values[-1],
        "q95": values[-1],
    }


def test_no_demand_recorded_yet(database: Database) -> None:
    with client_with(database, []) as client:
        body = client.get("/api/v1/forecast").json()
        dashboard = client.get("/api/v1/dashboard").json()
    assert body["predictor"] == "none"
    assert body["now"] is None
    assert body["points"] == []
    assert body["coverage95"] == {"15": None, "60": None}
    assert dashboard["demand"]["demand_gpus"] == []
    assert dashboard["demand"]["band"]["q95"] == []


def test_the_dashboard_band_ends_at_the_window_it_forecasts(
    written: tuple[Database, datetime, list[float]],
) -> None:
    database, start, values = written
    with client_with(database, [Broken(), Stub()]) as client:
        data = client.get("/api/v1/dashboard", params={"minutes": 90}).json()
        page = client.get("/").text
    assert {"goodput", "throughput", "decisions", "jobs", "shadow"} <= set(data)
    assert "utilization" not in data
    demand = data["demand"]
    assert data["predictor"] == demand["predictor"] == "stub"
    assert demand["fallback_reasons"] == ["broken: RuntimeError: no weights"]
    assert demand["capacity_gpus"] == 36.0
    shown = values[-90:]
    assert demand["demand_gpus"] == shown
    at = [datetime.fromisoformat(t) for t in demand["at"]]
    assert at == [start + timedelta(minutes=MINUTES - 90 + i) for i in range(90)]
    band = demand["band"]
    assert band["horizon_min"] == 15
    band_at = [datetime.fromisoformat(t) for t in band["at"]]
    # The band point at minute t is the forecast made at t - 15: the last 15 points
    # reach past now.
    assert band_at == [t + timedelta(minutes=15) for t in at]
    for j in range(15, 90):
        assert band_at[j - 15] == at[j]
        assert band["q95"][j - 15] == shown[j - 15] + BUFFER[15][2]
        assert band["q50"][j - 15] == shown[j - 15] + BUFFER[15][0]
    assert band["q90"] == [v + BUFFER[15][1] for v in shown]
    assert demand["p_arrival"] == {"15": [0.25] * 90, "60": [0.5] * 90}
    assert demand["coverage95"]["15"] == pytest.approx(expected(shown, 15)[1])
    assert 'id="demand"' in page
    assert "GPU demand" in page


def test_the_command_line_assembles_the_chain_and_falls_back_to_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import autotune.policies.forecast as forecast
    from autotune.cli.daemon import _forecasters
    from autotune.daemon.settings import load_settings

    monkeypatch.setattr(forecast, "demand_forecaster", lambda kind: f"loaded {kind}")
    assert _forecasters("lstm") == ["loaded lstm", "loaded persistence"]
    assert _forecasters("persistence") == ["loaded persistence"]
    assert _forecasters("none") == []

    def unreadable(kind: str) -> Any:
        raise InputError("not a forecaster checkpoint")

    monkeypatch.setattr(forecast, "demand_forecaster", unreadable)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert _forecasters("lstm") == []
    assert "forecast.unavailable" in [r.getMessage() for r in caplog.records]
    assert load_settings(None).forecast == "lstm"
    assert load_settings(None, forecast="none").forecast == "none"
    with pytest.raises(InputError, match="forecast"):
        load_settings(None, forecast="arima")
