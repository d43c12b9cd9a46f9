"""The Sia-compatible world (Jayaram Subramanya et al., "Sia: Heterogeneity-aware,
goodput-optimized ML-cluster scheduling", SOSP'23; the artifact ``siasosp23/artifacts``,
folder ``sia-simulator/``): Sia's heterogeneous cluster and workloads played as Sia's
simulator plays them.

- ``trace``: Sia's physics on each GPU type's measured traces (``SiaApp``, the
  simulated cluster's ``JobPhysics``);
- ``world``: its cluster, clock and jobs (``sia_env``);
- ``fifo``: the shared baseline both simulators run, first come first served on the
  fastest GPU type with room.

The artifact is read from a folder the caller names; nothing of it ships in the package.
"""
