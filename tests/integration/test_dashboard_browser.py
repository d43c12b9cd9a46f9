"""The dashboard as an operator opens it: ``autotune daemon`` in a child process on the
simulated cluster, a shadow policy and an override set through the API, and the page
rendered by headless Chromium. Each panel must hold the daemon's data: the cluster map's
GPUs, the tenants' GPUs held against their quotas, the jobs table, the active and shadow
versions, the override, the explanation of the decision named in the URL
(``#decision=ID``, what a click on a decision does), and plots with legends and axis
titles; and a click on a decision (a dot of the timeline, a row of the list), sent as
mouse events through Chromium's DevTools protocol, opens its explanation."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, ClassVar

import pytest
from helpers import HEADLESS_CHROMIUM, Api, DaemonProcess, free_port, wait_for

pytestmark = pytest.mark.subprocess

REASON = "dashboard test: keep the FFN in fp32"
SHADOW = "rules-0.1.0"


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None = None
    text: list[str] = field(default_factory=list)

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())


class Dom(HTMLParser):
    """Every element of a page with its attributes and the text inside it."""

    VOID: ClassVar[set[str]] = {
        "meta",
        "link",
        "br",
        "img",
        "input",
        "hr",
        "path",
        "rect",
        "line",
        "stop",
    }

    def __init__(self, page: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(
            tag, {k: v or "" for k, v in attrs}, self._open[-1] if self._open else None
        )
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(
            Element(tag, {k: v or "" for k, v in attrs}, self._open[-1] if self._open else None)
        )

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text.append(data)

    def by_id(self, id_: str) -> Element:
        found = [e for e in self.elements if e.attrs.get("id") == id_]
        assert len(found) == 1, f"#{id_}: {len(found)} elements"
        return found[0]

    def select(self, tag: str, attr: str, cls: str | None = None) -> list[Element]:
        return [
            e
            for e in self.elements
            if e.tag == tag
            and attr in e.attrs
            and (cls is None or cls in e.attrs.get("class", "").split())
        ]

    def cells(self, row: Element) -> list[Element]:
        return [e for e in self.elements if e.tag == "td" and e.parent is row]

    def within(self, ancestor: Element, tag: str) -> list[Element]:
        """The ``tag`` elements inside ``ancestor``, in order."""

        def inside(element: Element) -> bool:
            parent = element.parent
            while parent is not None and parent is not ancestor:
                parent = parent.parent
            return parent is ancestor

        return [e for e in self.elements if e.tag == tag and inside(e)]


@dataclass
class Live:
    api: Api
    port: int
    token: str
    override: dict[str, Any]
    decision: dict[str, Any]


@pytest.fixture(scope="module")
def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, browser: str) -> Iterator[Live]:
    port = free_port()
    api = Api(port)
    daemon = DaemonProcess(
        tmp_path_factory.mktemp("dashboard"),
        port,
        "daemon",
        tick_s=0.3,
        jobs=(8, 24),
        env={"AUTOTUNE_JOB_METRICS_EVERY_S": "0"},  # goodput at every tick: lines to draw
    )
    try:
        wait_for("the API", lambda: api.get("/healthz")["status"] == "ok", timeout_s=60)
        token = daemon.api_token()
        status, body = api.call("POST", f"/policies/{SHADOW}/shadow", token=token)
        assert status == 200, body
        running = wait_for("a running job", lambda: api.get("/jobs?state=running")["data"])
        pin = {
            "job_id": running[0]["job_id"],
            "precision": {"ffn": "fp32"},
            "ttl_s": 3600,
            "reason": REASON,
        }
        status, override = api.call("POST", "/overrides", pin, token=token)
        assert status == 201, override
        decision = wait_for(
            "the override's decision",
            lambda: [
                d
                for d in api.get(f"/decisions?job={pin['job_id']}&source=override")["data"]
                if d["override_id"] == override["id"]
            ],
        )[0]
        wait_for("shadowed ticks", lambda: api.get("/policies/shadow")["ticks"] >= 2)
        yield Live(api, port, token, override, decision)
    finally:
        daemon.stop()


def render(browser: str, url: str) -> str:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        done = subprocess.run(
            [
                browser,
                *HEADLESS_CHROMIUM,
                f"--user-data-dir={profile}",
                "--window-size=1400,1800",
                "--virtual-time-budget=6000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_every_panel_shows_the_daemons_data(live: Live, browser: str) -> None:
    api = live.api
    jobs_before = api.get("/jobs?limit=1")["count"]
    nodes = api.get("/cluster")["nodes"]
    explanation = api.get(f"/decisions/{live.decision['id']}/explain")
    active = api.get("/policies/active")["version"]
    tenants = api.get("/tenants")["data"]
    page = render(browser, f"http://127.0.0.1:{live.port}/#decision={live.decision['id']}")
    jobs_after = api.get("/jobs?limit=1")["count"]
    dom = Dom(page)
    status = dom.by_id("status").words
    assert status.startswith("jobs: "), status
    assert f"policy: {active}" in status
    assert "error" not in {c for e in dom.elements for c in e.attrs.get("class", "").split()}, [
        e.words for e in dom.elements if "error" in e.attrs.get("class", "").split()
    ]

    # Cluster map: one cell per GPU of every node, each held one naming its job.
    cells = dom.select("span", "data-gpu", cls="gpu")
    assert len(cells) == sum(n["gpu_count"] for n in nodes)
    for node in nodes:
        indexes = sorted(
            int(c.attrs["data-gpu"]) for c in cells if c.attrs["data-node"] == node["node_id"]
        )
        assert indexes == list(range(node["gpu_count"]))
    held = [c for c in cells if "held" in c.attrs["class"].split()]
    assert held, "no GPU held on the map"
    holders = {job for c in held for job in c.attrs["data-job"].split()}

    # Tenants: a row each, held against the quota; default's quota is 0, so the GPUs its
    # jobs hold on the map are all borrowed.
    rows_by_tenant = {r.attrs["data-tenant"]: r for r in dom.select("tr", "data-tenant")}
    assert set(rows_by_tenant) == {t["name"] for t in tenants}
    headers = [th.words for th in dom.within(dom.by_id("tenants-table"), "th")]
    default = rows_by_tenant["default"]
    shown = dict(zip(headers, (c.words for c in dom.cells(default)), strict=True))
    assert re.fullmatch(r"[\d.,]+ / 0", shown["held / quota (GPUs)"]), shown
    assert default.attrs["data-borrowing"] == "true"
    assert shown["use of the quota"].startswith("borrowing "), shown

    # Job events: a row each (when, job, event, detail), or the note that there is none.
    columns = [th.words for th in dom.within(dom.by_id("events-table"), "th")]
    assert columns == ["when (UTC)", "job", "event", "detail"]
    rows = dom.within(dom.by_id("events-body"), "tr")
    assert rows
    for row in rows:
        cells = [c.words for c in dom.cells(row)]
        assert len(cells) == 4 or cells == ["No job event in the window."], cells

    # Jobs table: a row per job (all of them: fewer than the page's 100), with state,
    # configuration and progress; the jobs on the map are in it. (The daemon ticks on
    # while the page reads: a job may start or end between two of its reads.)
    rows = dom.select("tr", "data-job")
    assert jobs_before <= len(rows) <= jobs_after
    states = {r.attrs["data-job"]: r.attrs["data-state"] for r in rows}
    assert holders <= set(states)
    assert any(states[job] == "running" for job in holders)
    columns = [th.words for th in dom.within(dom.by_id("jobs-table"), "th")]
    assert columns[:2] == ["job", "state"]
    assert columns[-1] == "why it waits / how it ended"
    configured = 0
    for row in rows:
        cell = dict(zip(columns, (c.words for c in dom.cells(row)), strict=True))
        assert cell["state"] == row.attrs["data-state"]
        assert re.fullmatch(r"\d+%", cell["progress"]), cell
        if row.attrs["data-state"] == "running":
            assert cell["JCT / age"].startswith("age ")
            if cell["layout"] != "–":  # its placing decision was in the page's read
                configured += 1
                assert re.fullmatch(r"dp\d+·tp\d+·pp\d+.*", cell["layout"]), cell
                assert re.fullmatch(r"[\d.]+ \[\d+(–\d+)?\]", cell["GPUs"]), cell
                assert re.fullmatch(r"(fp|bf)\d+.*", cell["precision"]), cell
                assert cell["compression"] != "–"
                assert re.fullmatch(r"policy|fallback|static|override #\d+", cell["decided by"])
        elif row.attrs["data-state"] == "pending":
            assert cell["why it waits / how it ended"], cell  # the job's reason
        elif row.attrs["data-state"] == "finished":
            assert cell["JCT / age"].startswith("JCT "), cell
    assert configured >= len(holders) // 2 + 1

    # Policies: the active version beside the shadow, with their comparison.
    assert dom.by_id("policy-active").attrs["data-version"] == active
    assert dom.by_id("policy-shadow").attrs["data-version"] == SHADOW
    policies = dom.by_id("policies").words
    assert active in policies
    assert SHADOW in policies
    assert re.search(r"agreement with the active one \d+% over \d+ ticks", policies), policies

    # Overrides: the one created through the API.
    (override,) = [
        r
        for r in dom.select("tr", "data-override")
        if r.attrs["data-override"] == str(live.override["id"])
    ]
    assert REASON in override.words
    assert live.override["job_id"] in override.words
    assert "ffn=fp32" in override.words

    # The explanation of the decision named in the URL.
    panel = dom.by_id("explain")
    assert panel.attrs["data-decision"] == str(live.decision["id"])
    assert dom.by_id("explain-why").words == " ".join(explanation["why"].split())
    assert f"override #{live.override['id']}" in panel.words
    if explanation["alternatives"]:
        assert "Alternatives considered" in panel.words
        assert explanation["alternatives"][0]["change"] in panel.words
    recent = dom.select("tr", "data-decision")
    assert recent, "no recent decision listed"

    # Plots: demand, goodput, decisions and the shadow's, with legends and axis titles.
    assert page.count('class="main-svg"') >= 4
    for title in ("GPU demand", "Goodput per job", "Decisions by source", "Shadow policy"):
        assert title in page
    for axis in ("time (UTC)", "GPUs", "goodput (samples/s", "predicted goodput (samples/s)"):
        assert axis in page, axis
    assert page.count('class="legend"') >= 4
    assert any(job in dom.by_id("goodput").words for job in holders)


class DevTools:
    """Chromium's DevTools protocol over its WebSocket (RFC 6455, text frames only):
    enough to evaluate JavaScript in a page and to send it mouse events."""

    def __init__(self, url: str) -> None:
        host, path = url.removeprefix("ws://").split("/", 1)
        name, port = host.rsplit(":", 1)
        self.sock = socket.create_connection((name, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self._read(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.calls = 0

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "DevTools closed the connection"
            data += chunk
        return data

    def _receive(self) -> dict[str, Any]:
        message = b""
        while True:
            first, second = self._read(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack(">H", self._read(2))
            elif size == 127:
                (size,) = struct.unpack(">Q", self._read(8))
            message += self._read(size)
            if first & 0x80:  # the final frame of the message
                result: dict[str, Any] = json.loads(message)
                return result

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        data = json.dumps({"id": self.calls, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        size = len(data)
        if size < 126:
            header = bytes([0x81, 0x80 | size])
        elif size < 1 << 16:
            header = bytes([0x81, 0x80 | 126]) + struct.pack(">H", size)
        else:
            header = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", size)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:
            message = self._receive()
            if message.get("id") == self.calls:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """Move there (Plotly finds the point under the mouse on hover), press, release."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        time.sleep(0.2)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def wait(self, what: str, expression: str, timeout_s: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")


OPENED = """(() => {
  const panel = document.getElementById("explain"), why = document.getElementById("explain-why");
  return why && {hash: location.hash, decision: panel.dataset.decision, why: why.textContent};
})()"""


def test_clicking_a_decision_opens_its_explanation(live: Live, browser: str) -> None:
    debug_port = free_port()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        chromium = subprocess.Popen(
            [
                browser,
                *HEADLESS_CHROMIUM,
                f"--user-data-dir={profile}",
                f"--remote-debugging-port={debug_port}",
                "--window-size=1400,1800",
                f"http://127.0.0.1:{live.port}/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            pages = wait_for(
                "DevTools",
                lambda: [
                    p
                    for p in json.load(
                        urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/json")
                    )
                    if p["type"] == "page"
                ],
            )
            tools = DevTools(pages[0]["webSocketDebuggerUrl"])
            tools.wait("the timeline", "document.querySelectorAll('#decisions .point').length")
            # A dot of the timeline, where Plotly drew it: the one nearest the middle
            # that no other dot overlaps (the shadow policy's decision of a job in the
            # same round draws in the same place, and a click takes the nearest).
            dot = tools.evaluate(
                """(() => {
                const plot = document.getElementById("decisions");
                plot.scrollIntoView({block: "center"});
                const layout = plot._fullLayout, trace = plot._fullData[0];
                const at = (t, k) => [layout.xaxis.d2p(t.x[k]), layout.yaxis.d2p(t.y[k])];
                const every = plot._fullData.flatMap(t => t.x.map((_, k) => at(t, k)));
                const alone = k => {
                  const [x, y] = at(trace, k);
                  return every.filter(([u, v]) => Math.hypot(u - x, v - y) < 12).length === 1;
                };
                const mid = Math.floor(trace.x.length / 2);
                const order = [...trace.x.keys()]
                  .sort((a, b) => Math.abs(a - mid) - Math.abs(b - mid));
                const found = order.find(alone);
                const i = found === undefined ? mid : found, box = plot.getBoundingClientRect();
                return {x: box.left + layout._size.l + layout.xaxis.d2p(trace.x[i]),
                        y: box.top + layout._size.t + layout.yaxis.d2p(trace.y[i]),
                        id: String(trace.customdata[i])};
                })()"""
            )
            tools.click(dot["x"], dot["y"])
            opened = tools.wait("the dot's explanation", OPENED)
            assert opened["hash"] == f"#decision={dot['id']}"
            assert opened["decision"] == dot["id"]
            why = live.api.get(f"/decisions/{dot['id']}/explain")["why"]
            assert opened["why"] == why
            # A row of the recent decisions, another decision.
            row = tools.evaluate(
                f"""(() => {{
                const row = [...document.querySelectorAll("#recent-body tr[data-decision]")]
                  .find(r => r.dataset.decision !== "{dot["id"]}");
                row.scrollIntoView({{block: "center"}});
                const box = row.getBoundingClientRect();
                return {{x: box.left + 20, y: box.top + box.height / 2, id: row.dataset.decision}};
                }})()"""
            )
            tools.click(row["x"], row["y"])
            mine = (
                f"(() => {{ const o = {OPENED}; return o && o.decision === '{row['id']}' && o }})()"
            )
            opened = tools.wait("the row's explanation", mine)
            assert opened["hash"] == f"#decision={row['id']}"
            assert opened["why"] == live.api.get(f"/decisions/{row['id']}/explain")["why"]
        finally:
            chromium.terminate()
            chromium.wait(timeout=30)
