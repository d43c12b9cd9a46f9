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


def test_the_progress_callback_pickles_without_what_it_reports_to() -> None:
    """Tune pickles its callbacks with the experiment; a progress bar holds locks."""
    import threading

    import cloudpickle

    lock = threading.RLock()
    callback = _progress_callback(lambda ended, iterations: lock.acquire(blocking=False))
    callback.on_trial_result(1, [], None, {})
    copy = cloudpickle.loads(cloudpickle.dumps(callback))
    assert (copy.ended, copy.iterations) == (0, 1)
    copy.on_trial_complete(2, [], None)  # reports to nothing, and does not fail
    assert (copy.ended, copy.iterations) == (1, 1)
