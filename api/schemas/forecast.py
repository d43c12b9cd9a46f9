"""Schemas of the forecast route: GPU demand per minute, the forecasts per horizon, and
how well the past forecasts held."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

__all__ = ["ArrivalCheck", "DemandPoint", "ForecastPublic", "HorizonForecast"]


class HorizonForecast(BaseModel):
    """One forecast for one horizon: will new GPU demand arrive, and how high will the
    demand peak."""

    p_arrival: float = Field(
        description="Probability (0 to 1) that new GPU demand arrives within the horizon: "
        "the demand rises from one minute to the next at least once"
    )
    q50: float = Field(description="Median of the peak GPU demand within the horizon, in GPUs")
    q90: float = Field(description="90% quantile of that peak, in GPUs")
    q95: float = Field(description="95% quantile of that peak, in GPUs")


class DemandPoint(BaseModel):
    at: datetime = Field(description="Start of the minute (UTC)")
    demand_gpus: float = Field(
        description="GPU demand at that minute, in GPUs: the GPUs running jobs hold plus "
        "the GPUs pending jobs ask for (the newest tick within the minute; a minute "
        "without a tick holds the one before)"
    )
    forecast: dict[int, HorizonForecast] = Field(
        description="Keyed by horizon in minutes: the forecast made at this minute, from "
        "it and the minutes before only, for the horizon after it"
    )


class ArrivalCheck(BaseModel):
    windows: int = Field(description="Forecasts whose horizon has passed within the window shown")
    observed_rate: float | None = Field(
        description="Share of those windows in which new demand did arrive (0 to 1; null "
        "when none has passed)"
    )
    mean_p_arrival: float | None = Field(
        description="Mean arrival probability forecast for those windows (0 to 1; null "
        "when none has passed): close to observed_rate when the forecast is calibrated"
    )


class ForecastPublic(BaseModel):
    predictor: str = Field(
        description="The forecaster that made the forecasts: the first of the daemon's "
        "chain that worked (lstm, persistence + buffer, or none)"
    )
    fallback_reasons: list[str] = Field(
        description="Why each forecaster before it did not (empty when the first worked)"
    )
    minutes: int = Field(description="Minutes of history asked for")
    truncated: bool = Field(
        description="The samples cap was reached: the window starts later than asked"
    )
    capacity_gpus: float = Field(
        description="The cluster's GPUs, parked nodes included (the most seen in the window)"
    )
    now: dict[int, HorizonForecast] | None = Field(
        description="Keyed by horizon in minutes: the forecast made at the newest minute "
        "(null when no demand has been recorded)"
    )
    points: list[DemandPoint] = Field(description="One per minute of the window, oldest first")
    coverage95: dict[int, float | None] = Field(
        description="Keyed by horizon in minutes: share of the forecasts whose horizon has "
        "passed within the window for which the peak demand stayed at or under q95 "
        "(about 0.95 when calibrated; null when none has passed)"
    )
    arrivals: dict[int, ArrivalCheck] = Field(
        description="Keyed by horizon in minutes: how often new demand arrived within the "
        "passed horizons, next to the mean probability forecast for them"
    )
