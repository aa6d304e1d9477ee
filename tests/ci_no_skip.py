"""Under CI=true no test may skip: every skip becomes a failure (a pytest plugin).

A skipped test is a green that proved nothing: a missing broker, a missing tool, a
privilege the runner lacks. Under CI=true every skip — from a test, a skip marker, a
fixture, or a whole module at collection — and every xfail is reported as a failure
that says why it skipped, unless the test carries
@pytest.mark.allow_skip(reason="why a skip under CI is acceptable") (none does).
Outside CI a skip stays a skip: a developer without a broker can still run the rest.

Enabled by tests/conftest.py; tests/unit/test_ci_no_skip.py runs it with `-p`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

ALLOW_SKIP = "allow_skip"


def _under_ci() -> bool:
    return os.environ.get("CI") == "true"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ALLOW_SKIP}(reason): this test may skip even under CI=true (say why)"
    )


def _skip_is_a_failure(report: Any, allowed: pytest.Mark | None) -> None:
    if not (_under_ci() and report.skipped):
        return
    if allowed is not None and allowed.kwargs.get("reason"):
        return
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if hasattr(report, "wasxfail"):
        why = f"xfail: {report.wasxfail}"  # an expected failure hides a test the same way
        del report.wasxfail
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, which is a failure here: {why}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _skip_is_a_failure(outcome.get_result(), item.get_closest_marker(ALLOW_SKIP))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    # A module-level pytest.skip / importorskip skips at collection: no test report.
    outcome = yield
    _skip_is_a_failure(outcome.get_result(), None)
