"""Shared fixtures: a temporary RabbitMQ vhost and PostgreSQL database per test, the CLI.

Under CI=true no test may skip (ci_no_skip.py, whose hooks are imported here).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

# pytest finds hooks by name in a conftest: importing them here enables them.
from ci_no_skip import (  # noqa: F401
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
)
from pg_support import temp_database
from support import broker_answers, management

ALL_PERMISSIONS = {"configure": ".*", "write": ".*", "read": ".*"}


# Tests that run several consumer processes at once on one ledger. Alone each passes;
# beside another such test on two cores a consumer's heartbeat write can wait past
# SQLite's busy timeout ("database is locked" on stderr, which they assert never
# appears). Under pytest-xdist (`--dist loadgroup`) they share one worker, one at a time.
ONE_AT_A_TIME = (
    "tests/faults/test_dirq_concurrency.py::",
    "tests/faults/test_dirq_signals.py::test_workers_stop_with_their_parent",
    "tests/faults/test_pg_many_consumers.py::",
    "tests/integration/test_twins_dirq.py::",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(ONE_AT_A_TIME):
            item.add_marker(pytest.mark.xdist_group("several-consumers"))


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@functools.cache
def _management_answers() -> bool:
    try:
        management("GET", "/api/overview")
        return True
    except OSError:
        return False


def _add_vhost(vhost: str) -> None:
    # The management API answers in milliseconds; each rabbitmqctl call starts an
    # Erlang VM (1-3 s of CPU here), three per test that takes a vhost. CI enables the
    # API (.ci/run); without it the vhost is made the old way.
    if _management_answers():
        management("PUT", f"/api/vhosts/{vhost}")
        management("PUT", f"/api/permissions/{vhost}/guest", ALL_PERMISSIONS)
    else:
        _rabbitmqctl("add_vhost", vhost)
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")


def _delete_vhost(vhost: str) -> None:
    if _management_answers():
        management("DELETE", f"/api/vhosts/{vhost}")
    else:
        _rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def amqp_url() -> Iterator[str]:
    """An AMQP URL into a fresh vhost of its own; the vhost is deleted afterwards.

    Without a broker the test fails under CI=true (a missing broker must not pass
    as green) and is skipped elsewhere.
    """
    if not broker_answers() or shutil.which("rabbitmqctl") is None:
        msg = "RabbitMQ is not answering on 127.0.0.1:5672 (or rabbitmqctl is missing)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    vhost = f"onceq-test-{uuid.uuid4().hex[:10]}"
    try:
        _add_vhost(vhost)
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    finally:
        _delete_vhost(vhost)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL of a fresh database of its own; dropped afterwards.

    Without PostgreSQL the test fails under CI=true and is skipped elsewhere.
    """
    yield from temp_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_target(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    """Where a ledger lives, once for each kind: an SQLite path, a PostgreSQL URL.

    The ledger contract (tests/contract/test_ledger_contract.py) and every test that
    must hold on both ledgers take this, and open it with `onceq._ledger.target.open_ledger`.
    """
    if request.param == "sqlite":
        yield str(tmp_path / "ledger.db")  # type: ignore[operator]
    else:
        yield from temp_database()
