"""A cluster of real machines on one host: network namespaces on shaped links, each
running a real ``ray start``, with faults to inject.

    python bench/testbed.py up [--machines 3] [--mbit 100] [--cpus 1]
    python bench/testbed.py leftovers

Each machine is a Linux network namespace with its own address (RFC 2544's benchmarking
range, ``198.18.0.1`` for the head, ``.2``, ``.3``... for the workers) on a veth pair
to a bridge in a namespace of its own, and a cgroup (v1 ``cpu`` or v2 ``cpu.max``) that
holds every process it runs. The head runs ``ray start --head`` and the workers ``ray
start --address``, with Ray's token authentication on (a token of the testbed's own,
``RAY_AUTH_TOKEN_PATH``; the user's ``~/.ray/auth_token`` is not touched) and a Ray
temporary directory per machine. Processes on different machines talk only over the
links, which are shaped with ``tc tbf`` in both directions (a machine's upload on its
``eth0``, its download on its bridge port), so a 100 Mbit/s network is one.

Not modelled: delay and packet loss (they need ``netem``, which this kernel lacks); a
partition is a link down, which drops every packet. The machines share the host's
disk, so a checkpoint directory is shared storage, as on a cluster with a network file
system.

Verbs, usable from tests and benchmarks: ``kill`` (SIGKILL every process of a machine:
its raylet, its workers, anything run there), ``restart`` (``ray start`` again),
``partition``/``heal`` (the machine's link down/up), ``cut``/``mend`` (the path between
two machines only: a daemon cut off from its database while it still reaches Ray),
``slow`` (a CPU quota), ``shape`` (a link's bandwidth, while running). ``run`` starts a
command on a machine, ``call``/``python`` run one there and wait for its output;
``inside`` runs the calling thread in a machine's network
namespace (to reach its addresses, the daemon's API for one), and ``client`` makes this
process a Ray driver on a machine. Everything is torn down on ``close`` (and on
leaving the ``with`` block, on an error or Ctrl-C): processes, namespaces, links,
cgroups, directories. ``leftovers()`` lists what any testbed of this host left.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PREFIX",
    "Machine",
    "Testbed",
    "TestbedError",
    "leftovers",
    "main",
    "missing",
]

PREFIX = "attb-"
"""What every testbed's namespaces and cgroups are named with."""
SUBNET = "198.18.0"
"""The machines' /24 (RFC 2544's benchmarking range)."""
RAY_PORT = 6379
CONTROL = 100
"""The control machine's index and last address byte (``198.18.0.100``)."""
_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
_CGROUP_V2 = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000
_CLONE_NEWNET = 0x40000000


class TestbedError(RuntimeError):
    """The testbed could not be built or a verb could not be applied."""


def missing() -> str | None:
    """Why a testbed cannot be built on this host, or ``None`` when it can."""
    if sys.platform != "linux":
        return "the testbed needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, tc, cgroups)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed needs `{tool}` (iproute2)"
    if _cgroup_root() is None:
        return "no cgroup CPU controller is mounted (/sys/fs/cgroup/cpu or cpu.max)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _cgroup_root() -> tuple[Path, int] | None:
    if (_CGROUP_V1 / "cpu.cfs_quota_us").exists():
        return _CGROUP_V1, 1
    if (_CGROUP_V2 / "cgroup.controllers").exists() and "cpu" in (
        _CGROUP_V2 / "cgroup.controllers"
    ).read_text().split():
        return _CGROUP_V2, 2
    return None


def _sh(*argv: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def _netns_pids(netns: str) -> list[int]:
    out = _sh("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in out.split()]


@dataclass(frozen=True, slots=True)
class Machine:
    """One machine of the testbed."""

    name: str
    """``head``, ``worker1``, ``worker2``..."""
    index: int
    netns: str
    address: str
    port: str
    """Its port on the bridge (in the bridge's namespace)."""
    cgroup: Path
    temp_dir: Path
    """Ray's temporary directory on this machine."""

    @property
    def is_head(self) -> bool:
        return self.index == 0


class Testbed:
    """``machines`` machines (2 to 4; the first is Ray's head) with ``cpus`` Ray CPUs
    each (or one count per machine), on links of ``mbit`` Mbit/s (``None``: unshaped).
    ``control``: one more machine, ``control``, that runs no Ray (an operator's machine:
    a database, an API client; a Ray driver such as the daemon or ``autotune job run``
    must run on a Ray machine, since a driver needs a raylet beside it).
    ``system_config``: Ray's system config for the head (``ray start --system-config``).
    ``ray=False`` builds the network and cgroups only."""

    def __init__(
        self,
        machines: int = 2,
        *,
        mbit: float | None = 100.0,
        cpus: int | Sequence[int] = 1,
        control: bool = False,
        ray: bool = True,
        object_store_mib: int = 256,
        system_config: Mapping[str, Any] | None = None,
    ) -> None:
        if not 2 <= machines <= 4:
            raise TestbedError(f"a testbed has 2 to 4 machines, not {machines}")
        counts = [cpus] * machines if isinstance(cpus, int) else list(cpus)
        if len(counts) != machines or min(counts) < 1:
            raise TestbedError(f"give each of the {machines} machines at least one CPU, not {cpus}")
        if mbit is not None and mbit <= 0:
            raise TestbedError(f"a link's bandwidth must be > 0 Mbit/s, not {mbit}")
        why = missing()
        if why:
            raise TestbedError(why)
        self.id = secrets.token_hex(3)
        self.cpus = counts
        self.object_store_mib = object_store_mib
        self.system_config = dict(system_config or {})
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{self.id}-"))
        self.bridge_netns = f"{PREFIX}{self.id}-br"
        cgroup_root, self._cgroup_version = _cgroup_root() or (_CGROUP_V1, 1)
        self.cgroup = cgroup_root / f"{PREFIX}{self.id}"
        self.machines = [
            Machine(
                name="head" if i == 0 else f"worker{i}",
                index=i,
                netns=f"{PREFIX}{self.id}-m{i}",
                address=f"{SUBNET}.{i + 1}",
                port=f"m{i}",
                cgroup=self.cgroup / f"m{i}",
                temp_dir=self.root / f"ray-m{i}",
            )
            for i in range(machines)
        ]
        if control:
            self.machines.append(
                Machine(
                    name="control",
                    index=CONTROL,
                    netns=f"{PREFIX}{self.id}-c",
                    address=f"{SUBNET}.{CONTROL}",
                    port="c0",
                    cgroup=self.cgroup / "c0",
                    temp_dir=self.root / "control",
                )
            )
        self.token_path = self.root / "auth_token"
        self._mbit: dict[str, float | None] = {}
        self._closed = False
        self.built_s = 0.0
        started = time.monotonic()
        try:
            self._build_network(mbit)
            if ray:
                self._start_ray()
        except BaseException:
            self.close()
            raise
        self.built_s = time.monotonic() - started

    # ----------------------------------------------------------------- building

    def _build_network(self, mbit: float | None) -> None:
        br = self.bridge_netns
        _sh("ip", "netns", "add", br)
        _sh("ip", "link", "set", "lo", "up", netns=br)
        _sh("ip", "link", "add", "br0", "type", "bridge", netns=br)
        _sh("ip", "link", "set", "br0", "up", netns=br)
        if self._cgroup_version == 2:
            control = self.cgroup.parent / "cgroup.subtree_control"
            with suppress(OSError):
                control.write_text("+cpu")
        self.cgroup.mkdir()
        if self._cgroup_version == 2:
            (self.cgroup / "cgroup.subtree_control").write_text("+cpu")
        for m in self.machines:
            _sh("ip", "netns", "add", m.netns)
            _sh("ip", "link", "set", "lo", "up", netns=m.netns)
            _sh(
                "ip", "link", "add", m.port, "type", "veth",
                "peer", "name", "eth0", "netns", m.netns,
                netns=br,
            )  # fmt: skip
            _sh("ip", "link", "set", m.port, "master", "br0", "up", netns=br)
            _sh("ip", "addr", "add", f"{m.address}/24", "dev", "eth0", netns=m.netns)
            _sh("ip", "link", "set", "eth0", "up", netns=m.netns)
            # No default route: a lookup of the host's name server then fails at once
            # (with one, its packets would be dropped at the bridge and every DNS lookup
            # would wait out the resolver's timeouts).
            m.cgroup.mkdir()
            m.temp_dir.mkdir()
            self.shape(m, mbit)
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)

    def _ray_start(self, machine: Machine) -> None:
        ray = Path(sys.executable).with_name("ray")
        argv = [
            str(ray) if ray.exists() else "ray", "start",
            "--node-ip-address", machine.address,
            "--num-cpus", str(self.cpus[machine.index]), "--num-gpus", "0",
            "--temp-dir", str(machine.temp_dir),
            "--object-store-memory", str(self.object_store_mib * 2**20),
            "--disable-usage-stats",
        ]  # fmt: skip
        if machine.is_head:
            argv += ["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"]
            if self.system_config:
                argv += ["--system-config", json.dumps(self.system_config)]
        else:
            argv += ["--address", self.ray_address]
        proc = self.run(machine, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            text = out.decode(errors="replace").strip().splitlines()
            raise TestbedError(f"`ray start` on {machine.name} failed: " + " / ".join(text[-5:]))

    def _start_ray(self) -> None:
        self._ray_start(self.machines[0])
        errors: list[BaseException] = []

        def start(m: Machine) -> None:
            try:
                self._ray_start(m)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(m,)) for m in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    # ----------------------------------------------------------------- using

    @property
    def head(self) -> Machine:
        return self.machines[0]

    @property
    def workers(self) -> list[Machine]:
        """The Ray machines other than the head."""
        return [m for m in self.machines[1:] if m.index != CONTROL]

    @property
    def ray_address(self) -> str:
        """The head's GCS address, what ``--ray-address`` takes."""
        return f"{self.head.address}:{RAY_PORT}"

    def machine(self, which: str | int | Machine) -> Machine:
        if isinstance(which, Machine):
            return which
        for m in self.machines:
            if which in (m.name, m.index, m.address, m.netns):
                return m
        raise TestbedError(f"no machine {which!r} in this testbed")

    @property
    def env(self) -> dict[str, str]:
        """The environment a Ray client of this cluster needs (token authentication)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def run(
        self,
        which: str | int | Machine,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        **popen: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` on a machine: in its network namespace and its cgroup, with the
        cluster's ``env`` (plus ``env``) over this process's environment."""
        m = self.machine(which)
        procs = m.cgroup / "cgroup.procs"

        def enter_cgroup() -> None:
            procs.write_text(str(os.getpid()))

        return subprocess.Popen(
            ["ip", "netns", "exec", m.netns, *argv],
            env={**os.environ, **self.env, **(env or {})},
            preexec_fn=enter_cgroup,
            start_new_session=True,
            **popen,
        )

    def python(
        self, which: str | int | Machine, code: str, *, timeout: float = 300, **run: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` on a machine and wait for it; its output is captured."""
        return self.call(which, [sys.executable, "-c", code], timeout=timeout, **run)

    def call(
        self,
        which: str | int | Machine,
        argv: Sequence[str],
        *,
        timeout: float = 300,
        **run: Any,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on a machine and wait for it, its output captured; past
        ``timeout`` seconds it is killed (with everything it started) and the result
        carries the kill's return code."""
        proc = self.run(
            which, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **run
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    @contextmanager
    def inside(self, which: str | int | Machine) -> Iterator[None]:
        """Run the calling thread in a machine's network namespace (sockets it opens
        meanwhile stay there): to reach the machine's addresses from a test."""
        m = self.machine(which)
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{m.netns}") as there:
            if libc.setns(there.fileno(), _CLONE_NEWNET) != 0:
                raise TestbedError(f"setns to {m.netns}: {os.strerror(ctypes.get_errno())}")
            try:
                yield
            finally:
                libc.setns(home.fileno(), _CLONE_NEWNET)

    def pids(self, which: str | int | Machine) -> list[int]:
        """The processes running on a machine."""
        return _netns_pids(self.machine(which).netns)

    # ----------------------------------------------------------------- faults

    def kill(self, which: str | int | Machine) -> list[int]:
        """SIGKILL every process of the machine (its raylet and workers, the head's GCS,
        anything run there), as a power cut would; returns their pids."""
        m = self.machine(which)
        pids = self.pids(m)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.pids(m) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    def restart(self, which: str | int | Machine) -> None:
        """``ray start`` the machine again (after ``kill``): a new Ray node joins."""
        m = self.machine(which)
        shutil.rmtree(m.temp_dir, ignore_errors=True)
        m.temp_dir.mkdir()
        self._ray_start(m)

    def partition(self, which: str | int | Machine) -> None:
        """Cut the machine off the network (its link down); ``heal`` undoes it."""
        _sh("ip", "link", "set", self.machine(which).port, "down", netns=self.bridge_netns)

    def heal(self, which: str | int | Machine) -> None:
        _sh("ip", "link", "set", self.machine(which).port, "up", netns=self.bridge_netns)

    def cut(self, a: str | int | Machine, b: str | int | Machine) -> None:
        """Drop every packet between two machines, both ways, while each still reaches
        the others (a blackhole route on each side); ``mend`` undoes it."""
        ma, mb = self.machine(a), self.machine(b)
        for here, there in ((ma, mb), (mb, ma)):
            _sh("ip", "route", "replace", "blackhole", f"{there.address}/32", netns=here.netns)

    def mend(self, a: str | int | Machine, b: str | int | Machine) -> None:
        ma, mb = self.machine(a), self.machine(b)
        for here, there in ((ma, mb), (mb, ma)):
            _sh(
                "ip", "route", "del", "blackhole", f"{there.address}/32",
                netns=here.netns, check=False,
            )  # fmt: skip

    @contextmanager
    def client(self, which: str | int | Machine = "head") -> Iterator[None]:
        """This process as a Ray driver of the testbed on a Ray machine: the calling
        thread in the machine's network namespace (threads it starts inherit it) and the
        cluster's ``env`` in ``os.environ``, both restored afterwards. Import Ray inside
        it, not before: Ray reads ``RAY_AUTH_MODE`` when it is imported."""
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            with self.inside(which):
                yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    @contextmanager
    def driver(self, which: str | int | Machine = "head") -> Iterator[None]:
        """``client``, connected: this process a Ray driver of the testbed for the block
        (``ray.init`` to its head), disconnected after it, on an error too. A process
        already connected to another Ray is refused: it cannot be a driver of two."""
        with self.client(which):
            import ray

            from autotune.ray_session import ensure_ray

            if ray.is_initialized():
                raise TestbedError(
                    "this process is a Ray driver already: drive the testbed from a process "
                    "of its own (python bench/...), as Ray reads the testbed's token "
                    "settings when it is imported"
                )
            ensure_ray(self.ray_address)
            try:
                yield
            finally:
                if ray.is_initialized():
                    ray.shutdown()

    def slow(self, which: str | int | Machine, cpus: float | None) -> None:
        """Cap the machine's processes at ``cpus`` CPUs of the host (``None``: no cap)."""
        m = self.machine(which)
        if cpus is not None and cpus <= 0:
            raise TestbedError(f"a CPU quota must be > 0 CPUs, not {cpus}")
        quota = -1 if cpus is None else max(1000, int(cpus * _PERIOD_US))
        if self._cgroup_version == 1:
            (m.cgroup / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (m.cgroup / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (m.cgroup / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {_PERIOD_US}")

    def shape(self, which: str | int | Machine, mbit: float | None) -> None:
        """Set the machine's link to ``mbit`` Mbit/s each way (``None``: unshaped)."""
        m = self.machine(which)
        for dev, netns in (("eth0", m.netns), (m.port, self.bridge_netns)):
            if mbit is None:
                _sh("tc", "qdisc", "del", "dev", dev, "root", netns=netns, check=False)
                continue
            rate = int(mbit * 1e6)
            # A bucket of at least a few ms at line rate and a whole 64 KiB GSO segment.
            burst = max(rate // 8 // 200, 96 * 1024)
            _sh(
                "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{rate}bit", "burst", str(burst), "latency", "100ms",
                netns=netns,
            )  # fmt: skip
        self._mbit[m.name] = mbit

    def bandwidth(self, which: str | int | Machine) -> float | None:
        """The machine's link bandwidth in Mbit/s (``None``: unshaped)."""
        return self._mbit[self.machine(which).name]

    # ----------------------------------------------------------------- teardown

    def close(self) -> None:
        """Tear everything down; safe to call twice, and after a failed build."""
        if self._closed:
            return
        self._closed = True
        names = [m.netns for m in self.machines] + [self.bridge_netns]
        _teardown(names, [self.cgroup], [self.root])

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        return {
            "ray_address": self.ray_address,
            "machines": [
                {
                    "name": m.name,
                    "address": m.address,
                    "netns": m.netns,
                    "mbit": self._mbit.get(m.name),
                }
                for m in self.machines
            ],
            "cpus": self.cpus,
            "env": self.env,
            "built_s": round(self.built_s, 2),
        }


def _kill_netns(netns: str) -> None:
    for _ in range(50):
        pids = _netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove_cgroup(path: Path) -> None:
    for child in sorted(path.glob("*/"), reverse=True):
        if child.is_dir():
            _remove_cgroup(child)
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:  # busy: a process is still leaving
            if exc.errno != errno.EBUSY:
                raise
            procs = path / "cgroup.procs"
            for pid in procs.read_text().split() if procs.exists() else []:
                with suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.1)


def _teardown(netns: Sequence[str], cgroups: Sequence[Path], dirs: Sequence[Path]) -> None:
    known = set(_sh("ip", "netns", "list", check=False).split())
    for name in netns:
        if name in known:
            _kill_netns(name)
    for group in cgroups:
        if group.exists():
            _remove_cgroup(group)
    for name in netns:
        if name in known:
            _sh("ip", "netns", "del", name, check=False)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def leftovers() -> list[str]:
    """What testbeds left on this host: namespaces, cgroups, directories (and the
    processes in those namespaces and cgroups)."""
    found: list[str] = []
    names = [n for n in _sh("ip", "netns", "list", check=False).split() if n.startswith(PREFIX)]
    for name in names:
        found.append(f"network namespace {name} ({len(_netns_pids(name))} processes)")
    root = _cgroup_root()
    if root is not None:
        for group in root[0].glob(f"{PREFIX}*"):
            found.append(f"cgroup {group}")
    found += [f"directory {d}" for d in Path(tempfile.gettempdir()).glob(f"{PREFIX}*")]
    return found


def clean() -> list[str]:
    """Tear down whatever testbeds left on this host; returns what was removed."""
    found = leftovers()
    names = [n for n in _sh("ip", "netns", "list", check=False).split() if n.startswith(PREFIX)]
    root = _cgroup_root()
    groups = list(root[0].glob(f"{PREFIX}*")) if root else []
    _teardown(names, groups, list(Path(tempfile.gettempdir()).glob(f"{PREFIX}*")))
    return found


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/testbed.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser(
        "up",
        help="build a testbed, print how to use it, and hold it until Ctrl-C",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    up.add_argument("--machines", type=int, default=3, help="machines (2 to 4)")
    up.add_argument("--mbit", type=float, default=100.0, help="link bandwidth, Mbit/s")
    up.add_argument("--cpus", type=int, default=1, help="Ray CPUs per machine")
    verbs.add_parser("leftovers", help="list what testbeds left on this host")
    verbs.add_parser("clean", help="tear down whatever testbeds left on this host")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.verb == "leftovers":
        found = leftovers()
        print("\n".join(found) if found else "nothing left")
        return 1 if found else 0
    if args.verb == "clean":
        found = clean()
        print("\n".join(f"removed {f}" for f in found) if found else "nothing to remove")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Ctrl-C tears down even where SIGINT came ignored (a command started in the
    # background of a script inherits that, and Python then leaves it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Testbed(args.machines, mbit=args.mbit, cpus=args.cpus) as bed:
            print(json.dumps(bed.describe(), indent=2))
            daemon = f"ip netns exec {bed.head.netns} env " + " ".join(
                f"{k}={v}" for k, v in bed.env.items()
            )
            print(
                "\nThe daemon on the head machine, training on the testbed:\n"
                f"  {daemon} autotune daemon --backend ray --ray-address {bed.ray_address}\n"
                f"Its API from this shell: ip netns exec {bed.head.netns} curl "
                f"http://127.0.0.1:8000/api/v1/cluster\n"
                "Ctrl-C tears the testbed down.",
                flush=True,
            )
            while True:
                time.sleep(3600)
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
