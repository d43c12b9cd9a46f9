"""The reinforcement-learning contract: what a policy sees, what it does and what it earns.

One definition each, used by the Gymnasium environment (training), the daemon's learned
policy (serving) and replay (offline learning):

- ``observation``: the observation layout (``FEATURES``) and its one encoder
  (``ObservationEncoder``);
- ``action``: the action layout (``ACTION_FIELDS``), its decoder (``decode_action``,
  ``decode_slot``) and its encoder (``encode_config``);
- ``acting``: how a learned policy acts and what the transition log keeps of it
  (``ActedStep``, the epsilon-greedy probabilities of its entries);
- ``environment``: what an episode is and what its reward weighs (``EnvConfig``);
- ``reward``: a round's outcome (``RoundOutcome``) and its reward (``reward``,
  ``job_rewards``).

The decision step (``autotune.decision``) turns the choices decoded here into decisions;
the environment builds its Gymnasium spaces from these layouts
(``autotune.envs.spaces``). Nothing here imports Gymnasium, Ray or torch.
"""
