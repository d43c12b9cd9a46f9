"""The physics: per-rank memory (``memory``), step time, throughput, goodput and power
(``model``), worker stragglers (``stragglers``), each job's online fit (``online``) and
the least-squares fitter it and the executor's calibration share (``fit``)."""
