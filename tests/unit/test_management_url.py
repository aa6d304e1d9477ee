"""Where `management_api` finds the RabbitMQ management API, and that its login stays secret."""

from __future__ import annotations

import pytest

from onceq._core.retry import RetryPolicy
from onceq._flows.flow import Flow
from onceq._sources.amqp.depths import flow_queues, management_api
from onceq._sources.amqp.plugin import RabbitSource
from onceq.errors import UsageError

AMQP = "amqp://alice:amqpSECRET1@broker.example:5672/prod"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAI_RABBITMQ_API", raising=False)


def test_default_is_the_amqp_host_on_15672_with_the_amqp_login() -> None:
    api = management_api(AMQP)
    assert api is not None
    assert str(api.base) == "http://broker.example:15672/api"
    assert api.url == "http://broker.example:15672"
    assert "amqpSECRET1" not in repr(api) + str(api.as_dict())


def test_amqps_defaults_to_https_so_the_password_never_crosses_in_clear() -> None:
    api = management_api("amqps://alice:pw12345@broker.example/prod")
    assert api is not None and str(api.base) == "https://broker.example:15671/api"


@pytest.mark.parametrize("value", ["off", "OFF", "", " off "])
def test_off_or_empty_disables_it(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert management_api(AMQP, value) is None
    monkeypatch.setenv("EAI_RABBITMQ_API", value)
    assert management_api(AMQP) is None


def test_the_environment_names_it_and_an_explicit_override_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EAI_RABBITMQ_API", "http://mgmt.example:8080")
    api = management_api(AMQP)
    assert api is not None and str(api.base) == "http://mgmt.example:8080/api"
    api = management_api(AMQP, "https://other.example")
    assert api is not None and str(api.base) == "https://other.example/api"


@pytest.mark.parametrize(
    ("override", "base"),
    [
        ("http://h:15672", "http://h:15672/api"),
        ("http://h:15672/", "http://h:15672/api"),
        ("http://h:15672/api", "http://h:15672/api"),
        ("http://h/rabbitmq/", "http://h/rabbitmq/api"),
        ("http://h/rabbitmq/api/", "http://h/rabbitmq/api"),
        ("http://mon:monSECRET2@h/x?y=1#z", "http://h/x/api"),
    ],
)
def test_a_proxy_prefix_is_kept_and_userinfo_query_fragment_are_dropped(
    override: str, base: str
) -> None:
    api = management_api(AMQP, override)
    assert api is not None and str(api.base) == base


def test_the_overrides_own_password_is_masked_wherever_it_is_shown() -> None:
    api = management_api(AMQP, "http://mon:monSECRET2@h:15672")
    assert api is not None
    assert api.url == "http://mon:***@h:15672"
    text = repr(api) + str(api.as_dict()) + str(api.base)
    assert "monSECRET2" not in text and "amqpSECRET1" not in text


@pytest.mark.parametrize(
    "bad", ["amqp://h:15672", "ftp://h", "http://h:0", "http://h:99999", "h:15672"]
)
def test_a_url_that_cannot_be_an_apis_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="--management-url"):
        management_api(AMQP, bad)


def test_a_bad_url_in_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAI_RABBITMQ_API", "ftp://u:envSECRET3@h")
    with pytest.raises(UsageError, match="EAI_RABBITMQ_API=") as caught:
        management_api(AMQP)
    assert "envSECRET3" not in str(caught.value)


def test_flow_queues_are_the_names_mq_topology_declares() -> None:
    flow = Flow("inv", RabbitSource("invoice.in"), retry=RetryPolicy(immediate=0, delays=(5, 120)))
    assert flow_queues(flow) == [
        ("ready", "invoice.in"),
        ("retry", "invoice.retry.5s"),
        ("retry", "invoice.retry.2m"),
        ("dead", "invoice.dead"),
    ]
    claims = Flow("c", RabbitSource("claim.in", dead_letter_queue="claims.parked"))
    states = [s for s, _ in flow_queues(claims)]
    assert states == ["ready", "retry", "retry", "retry", "retry", "dead"]
    assert flow_queues(claims)[-1] == ("dead", "claims.parked")
