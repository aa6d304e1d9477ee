"""Secrets never reach messages; exit codes are distinct."""

from __future__ import annotations

from onceq import errors


def test_redact_url_masks_the_password_and_keeps_the_rest() -> None:
    url = "amqp://svc:p%40ss:w0rd@broker.example:5671/prod"
    red = errors.redact_url(url)
    assert "w0rd" not in red and "p%40ss" not in red
    assert red.startswith("amqp://svc:***@broker.example:5671/prod")


def test_redact_url_leaves_a_url_without_password_alone() -> None:
    assert errors.redact_url("amqp://127.0.0.1/%2F") == "amqp://127.0.0.1/%2F"


def test_redact_text_masks_urls_inside_prose() -> None:
    text = "cannot connect to amqp://guest:hunter2@127.0.0.1:5672/v1 (refused); retry"
    out = errors.redact_text(text)
    assert "hunter2" not in out
    assert "amqp://guest:***@127.0.0.1:5672/v1 (refused); retry" in out


def test_every_error_kind_has_its_own_exit_code() -> None:
    codes = list(errors.EXIT_CODES.values())
    assert len(codes) == len(set(codes))
    assert 0 not in codes and 1 not in codes  # 1 is "threshold exceeded / check failed"


def test_redact_url_survives_a_port_that_is_not_a_number() -> None:
    out = errors.redact_url("amqp://guest:s3cret@127.0.0.1:notaport/%2F")
    assert "s3cret" not in out and "guest:***@" in out
