from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REQUIRE_TESTBED, SHARED_DATA, PostgresServer, no_postgres

from autotune.db import Database, sqlite_url

# The kernel tests run Triton's interpreter on CPU tensors. Triton reads this once, when
# it is imported (nothing above imports it), so it is set before any test module loads;
# TRITON_INTERPRET=0 keeps compiled kernels, on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "1")

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


# --- Ray ------------------------------------------------------------------------------
# One local Ray for the whole test run: started by the first test that asks for it and
# stopped when the run ends, so each module does not pay Ray's start (about 4 s here).
# Its logical CPUs are a scheduling count, not threads: the largest layout the tests
# train (dp x tp x pp = 2 x 2 x 2) places 8 one-CPU ranks, so it is never sized below 8,
# and on a larger machine it takes every core.
RAY_CPUS = max(8, os.cpu_count() or 1)


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[None]:
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray(_ray_session: None) -> str:
    """The address of the test run's local Ray (started if this is the first use, or if a
    test of a multi-node ``ray.cluster_utils.Cluster`` stopped it)."""
    import ray

    from autotune.ray_session import ensure_ray

    ensure_ray(num_cpus=RAY_CPUS)
    address: str = ray.get_runtime_context().gcs_address
    return address


@pytest.fixture
def database(tmp_path: Path) -> Database:
    db = Database(sqlite_url(tmp_path / "autotune.db"))
    db.upgrade()
    yield db
    db.dispose()


# --- PostgreSQL -----------------------------------------------------------------------
# The storage tests also run against PostgreSQL when one is at hand: the server named by
# AUTOTUNE_TEST_POSTGRES_URL (a database the tests may create databases next to), or a
# throwaway server started from the PostgreSQL binaries when initdb and pg_ctl are
# found (Debian's postgresql package). Otherwise those tests skip, saying why, unless
# AUTOTUNE_REQUIRE_POSTGRES is set (CI sets it): then they fail.


def _postgres_server() -> PostgresServer:
    import importlib.util

    if importlib.util.find_spec("psycopg") is None:
        no_postgres("psycopg is not installed (pip install 'autotune[postgres]')")
    try:
        return PostgresServer()
    except FileNotFoundError:
        no_postgres("no PostgreSQL: set AUTOTUNE_TEST_POSTGRES_URL or install postgresql")
    except KeyError:
        no_postgres("running as root and there is no postgres user to run the server")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL admin URL (``.../postgres``) for the session."""
    url = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    server = _postgres_server()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, which it may stop and start."""
    server = _postgres_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_database(postgres_server: str) -> Iterator[Database]:
    """A fresh, migrated PostgreSQL database, dropped afterwards."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"autotune_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    db = Database(make_url(postgres_server).set(database=name).render_as_string(False))
    db.upgrade()
    try:
        yield db
    finally:
        db.dispose()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """Each storage test once on SQLite and once on PostgreSQL (skipped when absent)."""
    if request.param == "sqlite":
        db = Database(sqlite_url(tmp_path / "autotune.db"))
        db.upgrade()
        yield db
        db.dispose()
    else:
        yield request.getfixturevalue("postgres_database")


# --- The testbed ----------------------------------------------------------------------
# Tests on machines of network namespaces (autotune.benchmarks.testbed) need root, `ip`
# and `tc`. Without them they skip, saying why, unless AUTOTUNE_REQUIRE_TESTBED is set
# (CI sets it): then they fail. After the whole run, nothing a testbed made may be left.


@pytest.fixture
def testbed_host() -> None:
    """Skip (or fail, where the testbed is required) on a host that cannot build one."""
    from autotune.benchmarks.testbed import missing

    why = missing()
    if why:
        if os.environ.get(REQUIRE_TESTBED):
            pytest.fail(f"{why} ({REQUIRE_TESTBED} is set)")
        pytest.skip(why)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from autotune.benchmarks.testbed import leftovers, missing

    if missing() is not None:
        return
    left = leftovers()
    if left:
        print("\nthe testbed left behind:\n  " + "\n  ".join(left))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
