"""A logged run for the replay tests: the daemon as ``autotune daemon`` builds it (the
learned policy acting epsilon-greedily, the transition log), ticked on the built-in job
stream, and its export (``autotune.replay.export``)."""

from __future__ import annotations

import logging

from autotune.cli.daemon import _learned_policy
from autotune.daemon.backends import build_backend
from autotune.daemon.settings import load_settings
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.policies.rules import RulesPolicy
from autotune.replay.log import TransitionLog

__all__ = ["EPISODE_ROUNDS", "TICKS", "run_daemon"]

TICKS = 36
EPISODE_ROUNDS = 20


def run_daemon(
    db_url: str,
    *,
    ticks: int,
    episode_rounds: int = EPISODE_ROUNDS,
    rules_ticks: frozenset[int] = frozenset(),
) -> Daemon:
    """The daemon as ``autotune daemon`` builds it (learned policy, transition log), on
    the built-in stream, ticked ``ticks`` times, then stopped; the ticks in
    ``rules_ticks`` (from 0) are decided by the rules instead, as the fallback would."""
    settings = load_settings(
        None, db_url=db_url, sim_initial_jobs=10, sim_max_jobs=14, exploration_epsilon=0.1
    )
    db = Database(settings.database_url)
    db.upgrade()
    daemon = Daemon(
        DaemonParts(
            db=db,
            backend=build_backend(settings),
            policy=_learned_policy(None, settings),
            fallback=RulesPolicy(),
            transitions=TransitionLog(
                round_s=settings.round_period_s,
                energy_weight=settings.energy_weight,
                episode_rounds=episode_rounds,
            ),
        )
    )
    daemon.start()
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    learned, rules = daemon.policy, RulesPolicy()
    try:
        for i in range(ticks):
            daemon.policy = rules if i in rules_ticks else learned
            daemon.tick()
    finally:
        logging.disable(previous)
    daemon.stop()
    return daemon
