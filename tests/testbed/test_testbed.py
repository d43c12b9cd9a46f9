"""The testbed itself: machines of network namespaces on shaped links, each running a
real ``ray start`` with token authentication, the fault and shape verbs, and teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.benchmarks import REPO
from autotune.benchmarks import testbed as tb
from autotune.benchmarks.testbed import leftovers

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("testbed_host")]

RECEIVER = """
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 5001))
server.listen()
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    first = conn.recv(1 << 20)
    started, total = time.perf_counter(), len(first)
    while chunk := conn.recv(1 << 20):
        total += len(chunk)
    print(total * 8 / (time.perf_counter() - started) / 1e6, flush=True)
    conn.close()
"""

SENDER = """
import socket, sys
with socket.create_connection(("{address}", 5001), timeout=10) as s:
    block = b"x" * (1 << 16)
    for _ in range({blocks}):
        s.sendall(block)
"""


def _left(bed: tb.Testbed) -> list[str]:
    return [item for item in leftovers() if bed.id in item]


def test_machines_run_ray_with_token_auth_and_leave_nothing_behind() -> None:
    started = time.monotonic()
    bed = tb.Testbed(2, mbit=100, control=True)
    try:
        build_s = time.monotonic() - started
        assert build_s <= 30, f"the testbed took {build_s:.1f} s to build"
        ask = (
            f"import json, ray; ray.init(address='{bed.ray_address}', log_to_driver=False); "
            "print(json.dumps(sorted((n['NodeManagerAddress'], n['Alive']) for n in ray.nodes())))"
        )
        seen = bed.python("control", ask, timeout=120)
        assert seen.returncode == 0, seen.stderr[-2000:]
        assert seen.stdout.strip().splitlines()[-1] == (
            '[["198.18.0.1", true], ["198.18.0.2", true]]'
        )
        refused = bed.python("control", ask, timeout=120, env={"RAY_AUTH_MODE": "disabled"})
        assert refused.returncode != 0, "a client without the cluster's token was let in"
        assert bed.pids("worker1"), "the worker machine runs no process"
    finally:
        bed.close()
    assert _left(bed) == []


def test_links_are_shaped_both_ways_and_change_while_running() -> None:
    with tb.Testbed(2, mbit=100, ray=False) as bed:
        receiver = bed.run(
            "worker1", [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True
        )
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "listening"
        measured = {}
        for mbit in (100.0, 25.0):  # the same link, reshaped while the receiver runs
            bed.shape("head", mbit)
            bed.shape("worker1", mbit)
            blocks = int(mbit * 1e6 / 8 * 1.5 / (1 << 16))  # about 1.5 s of traffic
            sent = bed.python("head", SENDER.format(address="198.18.0.2", blocks=blocks))
            assert sent.returncode == 0, sent.stderr
            measured[mbit] = float(receiver.stdout.readline())
        for mbit, got in measured.items():
            assert got == pytest.approx(mbit, rel=0.15), measured


def test_partition_cuts_a_machine_off_and_heal_brings_it_back() -> None:
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(1.5)\n"
        "try:\n    s.connect(('198.18.0.2', 5999))\n"
        "except ConnectionRefusedError:\n    print('reached')\n"
        "except OSError as exc:\n    print('cut', exc)\n"
    )
    with tb.Testbed(3, mbit=None, ray=False) as bed:
        assert bed.python("head", probe).stdout.startswith("reached")  # nobody listens: RST
        bed.partition("worker1")
        assert bed.python("head", probe).stdout.startswith("cut")
        other = probe.replace("198.18.0.2", "198.18.0.3")
        assert bed.python("head", other).stdout.startswith("reached")  # the rest still talk
        bed.heal("worker1")
        assert bed.python("head", probe).stdout.startswith("reached")


def test_slow_caps_a_machines_cpus_and_kill_leaves_no_process() -> None:
    burn = (
        "import time\nt0, c0 = time.perf_counter(), time.process_time()\n"
        "while time.perf_counter() - t0 < 2.0:\n    pass\n"
        "print((time.process_time() - c0) / (time.perf_counter() - t0))"
    )
    with tb.Testbed(2, mbit=None, ray=False) as bed:
        bed.slow("worker1", 0.25)
        share = float(bed.python("worker1", burn).stdout)
        assert share == pytest.approx(0.25, abs=0.08)
        bed.slow("worker1", None)
        assert float(bed.python("worker1", burn).stdout) > 0.6
        sleeper = bed.run("worker1", ["sleep", "300"])
        # `ip netns exec` joins the namespace just after it starts: wait for it there
        deadline = time.monotonic() + 10
        while sleeper.pid not in bed.pids("worker1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeper.pid in bed.pids("worker1")
        assert sleeper.pid in bed.kill("worker1")
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert bed.pids("worker1") == []
        with pytest.raises(tb.TestbedError, match="> 0 CPUs"):
            bed.slow("worker1", 0)


def test_bad_sizes_are_refused_before_anything_is_built() -> None:
    with pytest.raises(tb.TestbedError, match="2 to 4 machines"):
        tb.Testbed(5)
    with pytest.raises(tb.TestbedError, match="at least one CPU"):
        tb.Testbed(2, cpus=[1])
    with pytest.raises(tb.TestbedError, match="Mbit/s"):
        tb.Testbed(2, mbit=0)


def test_ctrl_c_on_the_command_tears_the_testbed_down() -> None:
    before = set(leftovers())
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "testbed.py"), "up", "--machines", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "198.18.0.1:6379" in text, text + proc.stderr.read()
        assert set(leftovers()) - before, "the command built nothing"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert set(leftovers()) - before == set()


def test_a_job_trains_across_machines_without_interface_settings() -> None:
    """Two ranks on two machines talk over the link on their nodes' own addresses (no
    GLOO_SOCKET_IFNAME: this host's name resolves to a loopback address)."""
    autotune = str(Path(sys.executable).with_name("autotune"))
    with tb.Testbed(2, mbit=100, control=True) as bed:
        argv = [
            autotune, "job", "run", "--task", "gpt-char", "--dp", "2", "--steps", "4",
            "--ray-address", bed.ray_address, "--json",
        ]  # fmt: skip
        proc = bed.run("head", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 0, err[-3000:]
        result = json.loads(out)
        assert result["steps"] == 4
        assert len({p["node"] for p in result["placement"]}) == 2
        assert result["bytes_sent"] > 0
