"""The top-level commands are imported only when run; `onceq --help` lists them unloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from onceq._cli import COMMANDS, app
from onceq._cli.lazy import LazyGroup


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_kept_sentence_is_the_one_its_command_help_starts_with(name: str) -> None:
    module, attribute, summary = COMMANDS[name]
    assert isinstance(app, LazyGroup)
    cmd = app.load(name)
    assert cmd.name == name and not cmd.hidden
    assert (cmd.callback.__module__, cmd.callback.__name__) == (module, attribute)
    # What `onceq --help` shows once loaded, at any width, is what it showed unloaded.
    for limit in (10**6, 74, 40):
        assert click.Command(name, help=summary).get_short_help_str(limit) == (
            cmd.get_short_help_str(limit)
        )


def test_help_imports_no_command_and_neither_asyncio_nor_sqlite() -> None:
    code = (
        "import sys\nfrom onceq._cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "print(' '.join(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.splitlines()[-1].split())
    assert "Commands:" in out.stdout
    assert loaded & {module for module, _, _ in COMMANDS.values()} == set()
    assert loaded & {"asyncio", "sqlite3", "aio_pika", "aiormq", "rich", "psycopg"} == set()


def test_a_mistyped_command_is_still_matched_against_every_name() -> None:
    group = LazyGroup("g", lazy={"dirq": ("onceq._cli.dirq", "dirq", "A queue.")})
    with pytest.raises(click.exceptions.NoSuchCommand) as info:
        group.resolve_command(click.Context(group), ["dirk"])
    assert info.value.possibilities == ["dirq"]


def _dirq_lazy() -> dict[str, tuple[str, str, str]]:
    from onceq._cli.dirq import LAZY

    return LAZY


@pytest.mark.parametrize("name", sorted(_dirq_lazy()))
def test_each_lazy_dirq_command_keeps_its_help_sentence(name: str) -> None:
    from onceq._cli.dirq import dirq

    module, attribute, summary = _dirq_lazy()[name]
    assert isinstance(dirq, LazyGroup)
    cmd = dirq.load(name)
    assert (cmd.callback.__module__, cmd.callback.__name__) == (module, attribute)
    for limit in (10**6, 74, 40):
        assert click.Command(name, help=summary).get_short_help_str(limit) == (
            cmd.get_short_help_str(limit)
        )


def test_dirq_lag_imports_neither_the_runner_nor_asyncio_sqlite_or_rich() -> None:
    code = "import sys\nimport onceq._cli.dirq\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "onceq._cli.dirq_consume" not in loaded
    assert loaded & {"asyncio", "sqlite3", "aio_pika", "aiormq", "rich", "psycopg"} == set()


def test_a_directory_queue_run_imports_no_other_source_nor_psycopg(tmp_path: Path) -> None:
    # A short batch's start-up is part of what it costs: a dirq run used to import
    # every built-in source's package (aio-pika's modules among them) to find its
    # own type, and the orders preset's first commit imported psycopg.
    code = (
        "import sys\nfrom onceq._cli import main\ntry:\n"
        f"    main(['dirq', 'consume', {str(tmp_path / 'q')!r}, '--json'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print(' '.join(sys.modules))"
    )
    queue = tmp_path / "q"
    subprocess.run([sys.executable, "-m", "onceq", "dirq", "init", str(queue)], check=True)
    for i in range(3):
        doc = {"msg_id": f"m-{i}", "order_no": "o-1", "seq": i, "amount": 1.5}
        (queue / "inbox" / f"m-{i}.json").write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout[: out.stdout.rindex("}") + 1])["processed"] == 3
    loaded = set(out.stdout.splitlines()[-1].split())
    others = {"onceq._sources.amqp", "onceq._sources.nats", "aio_pika", "aiormq", "nats"}
    assert loaded & (others | {"psycopg", "onceq._ledger.pg"}) == set()
