"""What the docs say about the code is what the code is.

- The exit codes listed by the README's table and by `onceq --help` are exactly the
  code's table (errors.EXIT_CODES, plus 0, 1, 130 and 143), in both directions; the
  codes docs/mq.md names are among them.
- `lag`'s row in the README's table says the code a real `lag` on a missing folder
  ends with.
- Every `onceq …` command shown in README.md and docs/*.md (code blocks and inline
  code) exists in the click group, and so does every option shown with it.
- Every module path docs/architecture.md names exists, and every module under
  src/onceq/ is named there.
- `onceq --version` prints the installed metadata's version, and no source file
  spells that version out (pyproject.toml is the one place it is set).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib.metadata import version
from pathlib import Path

import click
import pytest
from doc_examples import REPO, blocks, strip_comment

from cli_support import invoke
from onceq import errors
from onceq._cli import _register, app

CODE_TABLE = {*errors.EXIT_CODES.values(), 0, 1, 130, 143}
DOC_FILES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
SRC = REPO / "src" / "onceq"


def _section(doc: str, heading: str) -> str:
    text = (REPO / doc).read_text()
    m = re.search(rf"^#+ {re.escape(heading)}\s*$(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    assert m, f"{doc}: no section '{heading}'"
    return m.group(1)


def readme_exit_table() -> dict[int, str]:
    rows = re.findall(r"^\|\s*(\d+)\s*\|(.*)\|\s*$", _section("README.md", "Exit codes"), re.M)
    table = {int(code): meaning.strip() for code, meaning in rows}
    assert len(table) == len(rows), "a code appears twice in the README's table"
    return table


def test_readme_exit_table_is_the_codes_table() -> None:
    assert set(readme_exit_table()) == CODE_TABLE


def test_help_lists_the_codes_table() -> None:
    r = invoke("--help")
    assert r.returncode == 0, r.stderr
    epilog = " ".join(r.stdout.split("Exit codes:", 1)[1].split())
    listed = {int(n) for n in re.findall(r"(?:^|,)\s*(\d+) ", epilog)}
    assert listed == CODE_TABLE, epilog


def test_mq_doc_names_only_real_codes() -> None:
    text = " ".join(_section("docs/mq.md", "Exit codes").split())
    named = {int(n) for n in re.findall(r"(?:^|·)\s*(\d+) ", text)}
    assert named, text
    assert named <= CODE_TABLE


def test_readme_says_what_lag_does_on_a_missing_folder(tmp_path: Path) -> None:
    """The code the README's table gives `lag` for a missing folder is the one it exits with."""
    said = [
        c
        for c, meaning in readme_exit_table().items()
        if "`lag`" in meaning and "missing" in meaning
    ]
    assert len(said) == 1, "the README's exit table must give lag's missing-folder code once"
    r = invoke("dirq", "lag", str(tmp_path / "no-such-queue"), "10")
    assert r.returncode == said[0], (r.returncode, r.stderr)
    assert r.stderr.startswith("onceq: ") and r.stderr.count("\n") == 1


# --- every command shown exists ------------------------------------------------------


def _inline_commands(text: str) -> list[str]:
    return [m for m in re.findall(r"`(onceq(?: [^`]*)?)`", text)]


def _block_commands(doc: str) -> list[str]:
    out = []
    for b in blocks(doc):
        if b.lang not in ("sh", "bash", "console"):
            continue
        for line in b.lines:
            words = shlex.split(strip_comment(line), posix=True) if line.strip() else []
            for i, w in enumerate(words):
                if w == "onceq" or w.endswith("/onceq"):
                    rest = []
                    for x in words[i + 1 :]:
                        if x in ("&", "&&", "||", "|", ";") or x.endswith(";"):
                            rest.append(x.rstrip(";"))
                            break
                        rest.append(x)
                    out.append(" ".join(["onceq", *[r for r in rest if r]]))
    return out


def shown_commands() -> list[tuple[str, str]]:
    shown = []
    for doc in DOC_FILES:
        text = (REPO / doc).read_text()
        shown += [(doc, c) for c in _inline_commands(text)]
        shown += [(doc, c) for c in _block_commands(doc)]
    return shown


def resolve(command: str) -> tuple[click.Command, list[str]]:
    """The click command a shown `onceq …` names, and the options shown with it.

    Fails when a word after a group is not one of its subcommands, or when an option
    is not one the command (or the group it was given to) accepts.
    """
    _register()
    words = command.split()[1:]
    cmd: click.Command = app
    options: list[str] = []
    for w in words:
        w = w.strip("[]")
        if w in ("…", "...", "FILE...", "F…"):
            continue  # a placeholder: "any subcommand", "more files"
        if w.startswith("-"):
            name = w.split("=", 1)[0]
            known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
            known |= {"-h", "--help"}
            assert name in known, f"`{command}`: {cmd.name} has no option {name}"
            options.append(name)
        elif isinstance(cmd, click.Group):
            if w in ("&", "|"):
                break
            assert w in cmd.commands, f"`{command}`: {cmd.name} has no command {w!r}"
            cmd = cmd.commands[w]
        # anything else is an argument (a path, a number, a placeholder)
    return cmd, options


def test_docs_show_some_commands() -> None:
    shown = {c for _, c in shown_commands()}
    # The extraction itself works: known commands are found in both places.
    assert "onceq dirq init ./q --from ./fixtures/orders" in shown
    assert any(c.startswith("onceq mq consume --claim URL") for c in shown)


@pytest.mark.parametrize("doc,command", shown_commands(), ids=lambda v: str(v))
def test_every_command_shown_exists(doc: str, command: str) -> None:
    resolve(command)


def test_resolve_refuses_what_does_not_exist() -> None:
    with pytest.raises(AssertionError, match="no command"):
        resolve("onceq dirq nosuch ./q")
    with pytest.raises(AssertionError, match="no option"):
        resolve("onceq dirq consume ./q --nosuch")


# --- the architecture document names every module, and only real ones ----------------


def test_architecture_names_every_module_and_only_real_paths() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([\w./-]+\.py)`", text))
    missing_files = sorted(p for p in named if not (REPO / p).is_file())
    assert not missing_files, f"docs/architecture.md names files that do not exist: {missing_files}"
    modules = {str(p.relative_to(REPO)) for p in SRC.rglob("*.py")}
    unnamed = sorted(modules - named)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"


def test_no_doc_refers_to_a_missing_markdown_file() -> None:
    for doc in DOC_FILES:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", (REPO / doc).read_text()):
            assert (REPO / doc).parent.joinpath(target).resolve().is_file(), (doc, target)
        assert "DESIGN.md" not in (REPO / doc).read_text(), f"{doc} refers to DESIGN.md"


# --- the version is defined once ------------------------------------------------------


def test_version_is_the_metadata_version_and_defined_once() -> None:
    import onceq

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version("onceq") == declared == onceq.__version__
    r = invoke("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"onceq, version {declared}"
    spelled = [
        str(p.relative_to(REPO)) for p in SRC.rglob("*.py") if f'"{declared}"' in p.read_text()
    ]
    assert not spelled, f"the version is spelled out in {spelled}: read it from the metadata"
