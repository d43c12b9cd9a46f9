"""The daemon's side of learning from what happened: the transition log it writes each
tick (``log``), the export of logged runs as Parquet with RLlib's offline columns
(``export``), and the workload of logged runs (``workload``). Retraining and evaluating
policies from an export is ``autotune.policies.replay``'s work.
"""
