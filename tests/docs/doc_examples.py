"""Reading the command examples out of the Markdown docs (shared by the docs tests).

The rules, stated once so that nothing is skipped silently:

- Every line of a ```sh block is one example, run by `bash -c` in the order of the
  document. Blank lines and whole-line comments are not commands.
- A trailing comment that starts with `exit N` (`# exit 1: …`) says the command is
  expected to end with exit code N; any other line must exit 0.
- A line ending in `&` starts a background process (a stub server); the next line
  runs once it has printed its first line (it prints after it listens), and it is
  stopped at the end.
- A block of another language whose first line is `# file: NAME` (a flow file, a
  Python module) is written to NAME in the folder the examples run in, at its place in
  the document's order, so the lines after it can use it. Its other lines are the
  file, exactly as the reader sees them.
- The blocks under a heading listed in SKIPPED_SECTIONS are not run; the reason is
  given there and the test asserts that such a block still exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/mq.md", "docs/api.md", "docs/deploy.md")

SKIPPED_SECTIONS = {
    ("README.md", "Quick start"): (
        "installs onceq into .venv and runs the whole test suite, this test included"
    ),
}

FILE_MARK = re.compile(r"^#\s*file:\s*(\S+)\s*$")
EXPECT = re.compile(r"(?:^|\s)#\s*exit\s+(\d+)\b")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Example:
    doc: str
    lineno: int
    heading: str
    line: str  # as written in the document
    command: str  # the line without a trailing `&`
    expect: int
    background: bool
    file: str = ""  # a `# file: NAME` block: the command is the file's text, written to NAME

    def where(self) -> str:
        return f"{self.doc}:{self.lineno} (under '{self.heading}')"


@dataclass(frozen=True)
class Block:
    doc: str
    lang: str
    heading: str
    start: int  # line number of the first line inside the fence
    lines: tuple[str, ...]


def blocks(doc: str) -> list[Block]:
    """Every fenced block of a document, with the heading it sits under."""
    out: list[Block] = []
    heading = ""
    lang: str | None = None
    start = 0
    body: list[str] = []
    for n, raw in enumerate((REPO / doc).read_text().splitlines(), start=1):
        m = FENCE.match(raw)
        if lang is None:
            if m:
                lang, start, body = m.group(1), n + 1, []
            elif raw.startswith("#"):
                heading = raw.lstrip("#").strip()
        elif raw.startswith("```"):
            out.append(Block(doc, lang, heading, start, tuple(body)))
            lang = None
        else:
            body.append(raw)
    assert lang is None, f"{doc}: a code block opened at line {start - 1} is never closed"
    return out


def strip_comment(line: str) -> str:
    """The line without its trailing comment: from the first `#` that starts a word
    outside quotes (as the shell reads it)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def examples(doc: str) -> tuple[list[Example], list[Block]]:
    """(the examples to run, the blocks skipped by SKIPPED_SECTIONS) of one document."""
    run: list[Example] = []
    skipped: list[Block] = []
    for b in blocks(doc):
        mark = FILE_MARK.match(b.lines[0]) if b.lines and b.lang != "sh" else None
        if mark:
            run.append(
                Example(
                    doc=doc,
                    lineno=b.start,
                    heading=b.heading,
                    line=b.lines[0],
                    command="\n".join(b.lines[1:]) + "\n",
                    expect=0,
                    background=False,
                    file=mark.group(1),
                )
            )
            continue
        if b.lang != "sh":
            continue
        if (doc, b.heading) in SKIPPED_SECTIONS:
            skipped.append(b)
            continue
        for i, line in enumerate(b.lines):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            assert not stripped.endswith("\\"), (
                f"{doc}:{b.start + i}: continuation lines are not run by the docs test"
            )
            m = EXPECT.search(line)
            command = strip_comment(line)
            background = command.endswith("&") and not command.endswith("&&")
            if background:
                command = command[:-1].rstrip()
            run.append(
                Example(
                    doc=doc,
                    lineno=b.start + i,
                    heading=b.heading,
                    line=stripped,
                    command=command,
                    expect=int(m.group(1)) if m else 0,
                    background=background,
                )
            )
    return run, skipped
