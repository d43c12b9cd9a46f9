"""Fencing a job's ranks by the leader term that started them.

Several daemons may share one database and one Ray cluster; only the holder of the leader
lease decides (``autotune.daemon.leader``). A leader cut off from the database stops
deciding once its lease runs out, but the jobs it started are Ray actors that keep
training: when the next leader starts the same job, it would train on two placements at
once. A ``Fence`` prevents that, in Ray itself, whatever the database says:

* **Claim.** Before the leader of term ``t`` starts a job's ranks, it records ``t`` for
  the job in Ray's key-value store (the GCS), one key per term, never overwritten: the
  job's fence is the highest term recorded, so a claim that arrives late cannot lower it.
* **Check.** A runner checks the fence before it creates ranks, before every step it
  dispatches and before it writes a checkpoint; a newer term raises ``Fenced`` and the
  runner stops (its ranks are killed).
* **Stop the older.** Ranks are named actors (``<job>@t<term>/r<rank>/<attempt>`` in the
  ``autotune`` namespace) in named placement groups (``<job>@t<term>/pg/<attempt>``), so
  after claiming, the new leader kills every rank of the job started in an older term
  and waits until Ray reports each one dead, then removes their placement groups (whose
  slots its own ranks need), before it starts its own.

Why no step can run on two placements at once: a step is dispatched only after a check,
on ranks that existed before that check. If the check came before the claim, those ranks
existed before the new leader listed the job's actors, so it killed them and waited for
their death before starting its own; if after, the check failed and nothing was
dispatched. Ranks of a daemon that dies go with it (Ray kills the actors a dead driver
owns).
"""

from __future__ import annotations

import re
import time
from contextlib import suppress
from dataclasses import dataclass

from autotune.executor.errors import ExecutorError

__all__ = ["NAMESPACE", "Fence", "Fenced"]

NAMESPACE = "autotune"
"""The Ray namespace of fenced jobs' rank actors and of their fence keys."""

_KEY = "fence/{job}/"
_NAME = re.compile(r"@t(?P<term>\d+)/(?:r\d+|pg)/")


class Fenced(ExecutorError):  # noqa: N818 - named for what happened, like Ray's errors
    """The job was claimed by a newer leader term: this runner must not train it."""

    def __init__(self, job_id: str, term: int, holder: int) -> None:
        super().__init__(f"job {job_id}: fenced: term {holder} holds it, this runner's is {term}")
        self.job_id, self.term, self.holder = job_id, term, holder


@dataclass(frozen=True, slots=True)
class Fence:
    """The fence of job ``job_id`` as seen by the leader of ``term``."""

    job_id: str
    term: int

    def _prefix(self) -> bytes:
        return _KEY.format(job=self.job_id).encode()

    def claim(self) -> None:
        """Record this term for the job (the job's fence is the highest term recorded)."""
        from ray.experimental import internal_kv

        key = self._prefix() + f"{self.term:012d}".encode()
        internal_kv._internal_kv_put(key, b"1", overwrite=False, namespace=NAMESPACE)

    def holder(self) -> int | None:
        """The highest term recorded for the job (``None``: never claimed)."""
        from ray.experimental import internal_kv

        keys = internal_kv._internal_kv_list(self._prefix(), namespace=NAMESPACE)
        terms = [int(k[len(self._prefix()) :]) for k in keys]
        return max(terms) if terms else None

    def check(self) -> None:
        """``Fenced`` if a newer term holds the job."""
        holder = self.holder()
        if holder is not None and holder > self.term:
            raise Fenced(self.job_id, self.term, holder)

    def actor_name(self, rank: int, attempt: str) -> str:
        """The name of this term's rank ``rank`` (``attempt``: unique per start)."""
        return f"{self.job_id}@t{self.term}/r{rank}/{attempt}"

    def group_name(self, attempt: str) -> str:
        """The name of this term's placement group of the job's ranks."""
        return f"{self.job_id}@t{self.term}/pg/{attempt}"

    def _older(self, name: str) -> bool:
        if not name.startswith(self.job_id):
            return False
        found = _NAME.match(name, len(self.job_id))
        return found is not None and int(found["term"]) < self.term

    def _older_ranks(self) -> list[str]:
        import ray

        return [
            str(actor["name"])
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == NAMESPACE and self._older(str(actor["name"]))
        ]

    def _remove_older_groups(self) -> list[str]:
        import ray
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        removed = []
        for group_id, group in ray.util.placement_group_table().items():
            name = str(group.get("name") or "")
            if group.get("state") != "REMOVED" and self._older(name):
                with suppress(Exception):  # removed meanwhile
                    remove_placement_group(
                        PlacementGroup(PlacementGroupID(bytes.fromhex(group_id)))
                    )
                removed.append(name)
        return removed

    def stop_older(self, timeout_s: float = 60.0) -> list[str]:
        """Kill the job's ranks of older terms, wait until Ray reports them dead, and
        remove their placement groups; returns the names of both. ``ExecutorError`` if a
        rank is still alive after ``timeout_s`` (the job must not start: the caller tries
        again later)."""
        import ray

        killed = self._older_ranks()
        for name in killed:
            with suppress(ValueError):  # dead already: its name is free
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        deadline = time.monotonic() + timeout_s
        while alive := sorted(set(killed) & set(self._older_ranks())):
            if time.monotonic() >= deadline:
                raise ExecutorError(
                    f"job {self.job_id}: {len(alive)} rank(s) of an older term still alive "
                    f"after {timeout_s:g} s ({', '.join(alive[:4])})"
                )
            time.sleep(0.1)
        return killed + self._remove_older_groups()
