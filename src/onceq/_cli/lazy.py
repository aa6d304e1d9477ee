"""A click group whose commands are imported only when one is run (click's LazyGroup).

Start-up time: `onceq dirq lag` runs from a monitor every few seconds and `onceq
--help` is typed, so neither may pay for importing every command module (with
aio-pika, sqlite3, asyncio, rich behind them). Each command module can then import
what it needs at its top.

`onceq --help` lists each command by its first sentence, kept here with the module
that defines it, so listing them imports none; tests/unit/test_cli_lazy.py checks
that each kept sentence is the one the command's own help starts with.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from gettext import gettext

import click


class LazyGroup(click.Group):
    """`lazy`: name -> (module, attribute, first sentence of the command's help)."""

    def __init__(self, *args: object, lazy: Mapping[str, tuple[str, str, str]], **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.load(cmd_name)
        return self.commands.get(cmd_name)

    def load(self, cmd_name: str) -> click.Command:
        """Import the command's module and add the command (once)."""
        module, attribute, _summary = self.lazy[cmd_name]
        cmd = getattr(importlib.import_module(module), attribute)
        assert isinstance(cmd, click.Command), f"{module}.{attribute} is not a click command"
        self.add_command(cmd, cmd_name)
        return cmd

    def load_all(self) -> None:
        """Every command imported, a lazy group's too (for what walks the whole tree:
        tests, docs checks)."""
        for name in self.lazy:
            cmd = self.get_command(click.Context(self), name)
            if isinstance(cmd, LazyGroup):
                cmd.load_all()

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            # click suggests a close name from the commands it holds: every name here,
            # loaded or not ("No such command 'dirk'. Did you mean 'dirq'?").
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, but a command not yet imported is shown by its kept sentence.

        click shortens it to the terminal's width exactly as it would the real help.
        """
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name) or click.Command(name, help=self.lazy[name][2])
            if not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section(gettext("Commands")):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])
