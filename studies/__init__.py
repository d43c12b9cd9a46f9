"""Studies: other systems' worlds, reproduced so that autotune can be measured in them.

A study is a package of its own that plugs into the product without the product knowing
it: its physics into the simulated cluster (``autotune.envs.simulator.JobPhysics``), its
knobs as an environment wrapper, its world into PPO's training (entry point group
``autotune.worlds``) and its commands into the ``autotune`` command line (entry point
group ``autotune.commands``). Nothing outside ``autotune.studies`` imports it.

- ``pollux``: Pollux's world (Qiao et al., OSDI'21): its workloads on its measured
  physics, clock and knobs, its policies and the learned policy that beats it there.
"""
