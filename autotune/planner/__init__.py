"""The Planner: which GPUs each job's ranks run on.

Pure and synchronous, like AdaptDL's ``PolluxPolicy.optimize``: typed jobs, nodes,
chosen configs and current placements in; placements and reasons out. No I/O.

How it works
------------
``plan()`` (``rounds``) runs these steps in order; each names the module that holds it.

1. **Feasibility** (``feasibility``). For every job and GPU model: is the model allowed
   (``gpu_types``) and does one rank fit its share of that GPU's memory
   (``autotune.perf.memory``)? A job no model can hold comes back unplaced with the
   reason; it is never placed. Jobs with the same request share this work.
2. **Placement units** (``jobs``). Ranks that must share a node form a unit: the whole
   job when ``max_nodes == 1`` (a Kubernetes pod); otherwise blocks of consecutive
   ranks, a multiple of ``tp`` and at most one node's GPUs, so tensor-parallel groups
   never cross the network and pipeline neighbours fill a node before the next one is
   used. When no node can take a block, the job is retried with smaller blocks (down to
   ``tp``).
   **One GPU model per job** (``matching``). Synchronous training runs at the pace of
   its slowest GPU (``autotune.perf.model.shape_of``), so all units of a job go to nodes
   of one model: in each round, a job of several units may use only the model, among
   those with a node able to take each of its units, where its units cost least on their
   cheapest nodes (below; the fastest adequate model unless scarcity says otherwise).
   With no such model, it is retried with smaller blocks, else unplaced (but see 6).
3. **Waiting jobs** (``pending``). Running jobs keep their placement first
   (``capacity``). A pending job asking for more GPUs than its allowed models then have
   free (GPUs with at least its milli free; for a job that may span nodes, than one of
   its allowed models has free) cannot be placed, as the cluster only fills from here
   on: it comes back unplaced at once with the count and never enters a round. When no
   GPU is free, no round runs.
   (Checked once, before the rounds: dropping jobs between rounds would change the
   batches, and with them the placements of the other jobs.)
4. **Decision rounds** (``matching``). Pending jobs are taken in order (priority, then
   submission) in batches of ``round_size`` units. Each round builds a units x nodes
   cost matrix, where an entry is the cost of the cheapest GPU set for the unit on that
   node, and solves it with ``scipy.optimize.linear_sum_assignment``; every unit also
   gets a private "not this round" column, priced far above any real entry and in
   proportion to the unit's GPUs, so the matching allocates as many GPUs as it can,
   earlier jobs first on equal terms. A node takes at most one new unit per round, so
   every entry is exact against the round's state.
   The matrix is built once per distinct request in the batch (shape and per-model
   terms) with numpy, plus one row per unit of a running job that moves. Columns are
   pruned to each row's ``rows`` cheapest nodes, which cannot change the optimum (at
   most ``rows - 1`` of them are taken by other rows).
5. **Gang semantics** (``matching``, ``rounds``). A job whose units were not all matched
   releases them all and waits for the next round; a job that no node set can take is
   unplaced with a reason (``reasons``).
6. **Packing fallback** (``packing``). A job that may span nodes, without tensor
   parallelism, on whole GPUs, that no equal blocks could place (6 ranks on nodes with
   4, 1 and 1 free GPUs) takes the free GPUs as they are, the nodes with most free
   first, on one GPU model: unequal blocks beat waiting while the GPUs it needs are
   idle. Pollux's simulator places every job this way.
   With ``mix_models`` (a backend whose jobs take batch shares by speed), a
   data-parallel job of a known model that no one model has room for (step 3, or no
   equal blocks and no packing here) may take free GPUs of several models, the fastest
   first, where the performance model says that runs it faster than the free GPUs of
   its best model alone (``packing.pack_mixed``; ``PlanResult.mixed`` says why). Those
   of step 3 try after the rounds, on the GPUs the rounds left free.

The cost of a unit on a node (lower is better), in GPU-equivalents (``costs``):

- fragmentation (``fragmentation``): growth of the node's fragmentation, the GPU
  capacity that the pending workload's typical requests could no longer use (FGD, Weng
  et al., "Beware of Fragmentation", USENIX ATC 2023), including requests the node's CPU
  or memory can no longer host;
- scarcity: GPUs taken from a model in demand by jobs that can run only on few models,
  weighted by that model's pressure (``pending``: pending demand spread over allowed
  models / free);
- compute fit: how much slower this GPU model runs the job than the fastest allowed one
  (per model, from ``feasibility``);
- memory headroom: a rank that would use more than 90% of the GPU's memory (per model,
  from ``feasibility``);
- moving: ranks of a running job that would leave the node they are on.

Throughout, ``capacity.FreeCapacity`` is what is free on each node during the call.
Beside the Planner: ``baseline`` (first-fit, what it is measured against) and
``verify`` (an independent check of placements).
"""

from __future__ import annotations

from autotune.planner.baseline import first_fit
from autotune.planner.capacity import FreeCapacity
from autotune.planner.costs import CostWeights
from autotune.planner.feasibility import largest_gang
from autotune.planner.fragmentation import WorkloadClasses
from autotune.planner.matching import UNPLACED_COST
from autotune.planner.rounds import PlanResult, plan
from autotune.planner.verify import verify_placements

__all__ = [
    "UNPLACED_COST",
    "CostWeights",
    "FreeCapacity",
    "PlanResult",
    "WorkloadClasses",
    "first_fit",
    "largest_gang",
    "plan",
    "verify_placements",
]
