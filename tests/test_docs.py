"""The manual: the MkDocs site in ``docs/`` builds under ``--strict`` (``mkdocs.yml``'s
``validation`` turns a broken link or anchor, a page left out of the nav and an included
file that is missing into failures), and the README stays a short page whose links lead
somewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

README_MAX_LINES = 250

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""An inline Markdown link or image: its target."""


def mkdocs() -> str:
    """The ``mkdocs`` next to this Python (the dev extra installs it), else on the path."""
    path = Path(sys.executable).parent / "mkdocs"
    if path.exists():
        return str(path)
    found = shutil.which("mkdocs")
    if found is None:
        pytest.fail("mkdocs is not installed: install the dev extra (pip install -e '.[dev]')")
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def readme_links() -> list[str]:
    text = (REPO / "README.md").read_text()
    without_code = re.sub(r"```.*?```", "", text, flags=re.S)
    return LINK.findall(without_code)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=environment,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "results" / "index.html").is_file()


def test_the_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_relative_link_in_the_readme_leads_to_a_file_or_heading() -> None:
    readme = (REPO / "README.md").read_text()
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in re.sub(r"```.*?```", "", readme, flags=re.S).splitlines()
        if line.startswith("#")
    }
    links = [link for link in readme_links() if not re.match(r"[a-z][a-z0-9+.-]*:", link)]
    assert links, "the README links to the manual"
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        if not path:
            if anchor not in anchors:
                broken.append(link)
        elif not (REPO / path).exists():
            broken.append(link)
    assert not broken, f"README.md links to what does not exist: {broken}"


def test_the_anchor_rule_matches_github() -> None:
    assert github_anchor(" Two commands") == "two-commands"
    assert github_anchor("Training for real: the executor") == "training-for-real-the-executor"
    assert github_anchor("GPU suite (`bench/gpu_suite.sh`)") == "gpu-suite-benchgpu_suitesh"
