from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.db import Database, sqlite_url

# The kernel tests run Triton's interpreter on CPU tensors. Triton reads this once, when
# it is imported (nothing above imports it), so it is set before any test module loads;
# TRITON_INTERPRET=0 keeps compiled kernels, on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
ALIBABA = SHARED_DATA / "alibaba-v2023"
POLLUX = SHARED_DATA / "pollux"
HELIOS = SHARED_DATA / "helios"


@pytest.fixture
def alibaba_dir() -> Path:
    if not ALIBABA.is_dir():
        pytest.skip(f"public traces not present at {ALIBABA} (a checkout without ../shared)")
    return ALIBABA


@pytest.fixture
def pollux_dir() -> Path:
    if not POLLUX.is_dir():
        pytest.skip(f"public traces not present at {POLLUX} (a checkout without ../shared)")
    return POLLUX


@pytest.fixture
def helios_dir() -> Path:
    if not HELIOS.is_dir():
        pytest.skip(f"public traces not present at {HELIOS} (a checkout without ../shared)")
    return HELIOS


@pytest.fixture
def database(tmp_path: Path) -> Database:
    db = Database(sqlite_url(tmp_path / "autotune.db"))
    db.upgrade()
    yield db
    db.dispose()
