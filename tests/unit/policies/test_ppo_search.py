"""The ASHA search's progress: what ``autotune tune-policy``'s bar shows (the search itself
runs in tests/integration/test_learning.py)."""

from __future__ import annotations

from autotune.policies.ppo_search import _progress_callback


def test_the_progress_callback_counts_iterations_and_trials_that_ended() -> None:
    from ray import tune

    calls: list[tuple[int, int]] = []
    callback = _progress_callback(lambda ended, iterations: calls.append((ended, iterations)))
    assert isinstance(callback, tune.Callback)
    # Tune's hooks as it calls them: (iteration, trials, trial, result) and keywords.
    callback.on_trial_result(iteration=1, trials=[], trial=None, result={})
    callback.on_trial_result(1, [], None, {})
    callback.on_trial_complete(iteration=2, trials=[], trial=None)
    callback.on_trial_error(iteration=3, trials=[], trial=None)
    assert calls == [(0, 1), (0, 2), (1, 2), (2, 2)]
