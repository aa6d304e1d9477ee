"""The console's JSON API against its own OpenAPI document, by property-based runs
(schemathesis): whatever a request holds, no 5xx and no answer outside the document."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from console_support import Served, dead_queue, serve
from onceq._console.openapi import document

SCHEMA = schemathesis.openapi.from_dict(document())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    flow, root, ledger = dead_queue(tmp_path_factory.mktemp("schema"))
    yield from serve(flow, root, ledger)


@SCHEMA.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_keeps_to_its_document(case: Any, served: Served) -> None:
    # Every check but one: a well-formed request for a flow or a dead letter that does
    # not exist is a 404, and no document can list which keys are dead right now.
    # The page's CSRF token on every request, so that changes are tried for real (a
    # replay of whatever the generated body selects) and not only refused.
    headers = {"X-CSRF-Token": served.csrf()}
    case.call_and_validate(
        base_url=served.url, headers=headers, excluded_checks=[positive_data_acceptance]
    )
