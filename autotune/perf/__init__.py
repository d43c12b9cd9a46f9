"""The physics: per-rank memory (``memory``), step time, throughput, goodput and power
(``model``), worker stragglers (``stragglers``), the Pollux applications' fits
(``pollux``) and the least-squares fitter they and the executor's calibration share
(``fit``)."""
