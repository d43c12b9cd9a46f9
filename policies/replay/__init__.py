"""Learning from the daemon's logged decisions, offline: ``autotune replay train`` and
``autotune replay evaluate``.

- ``train``: retrain the learned policy from an export with RLlib's BC or MARWIL
  (``learner``: the loss over the action entries that mattered), then optionally PPO on
  the replayed workload in the simulator;
- ``evaluate``: compare policies on the logged workload by counterfactual simulation and
  by off-policy estimates, with a verdict;
- ``logged``: the logged decisions as the estimates read them, and a target policy's
  importance weights;
- ``ope``: the off-policy estimates (self-normalised importance sampling, doubly robust)
  with episode-bootstrap intervals, and the paired comparison of two policies.

What the daemon logs (``autotune.replay.log``) and how an export is written
(``autotune.replay.export``) are the daemon's side, in the core.
"""
