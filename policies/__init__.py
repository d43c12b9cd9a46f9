"""Policies that choose each job's configuration: the transparent rule-based policy
here; learned policies (RLlib) and baselines join it behind the same ``Policy``
interface (``autotune.interfaces.Policy``)."""
