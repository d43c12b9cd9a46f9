"""The pure decision step, in the core: what a round decides, from what the policy chose.

- ``step``: ``decide(snapshot, choices, overrides, ...)``, the one decision step of the
  daemon's tick, the training environment and replay (memory rule, overrides, Planner),
  and ``policy_view``, the snapshot the policy is asked about;
- ``overrides``: what a user's pin means (``pinned_config``, ``pinned_placement``) and
  the checks the API runs before storing one (``check_override``);
- ``explain``: why a decision, with the alternatives and their predicted goodput;
- ``fallback``: another policy deciding where the intended one cannot, said as such.

None of it reads or writes storage, keeps state or calls a policy; the daemon
(``autotune.daemon``) asks the policy and the fallback, stores the round and applies it.
"""
