"""Before/after in one run: the onceq side of a bench, run again with another checkout's code.

Every bench takes `--compare PATH` (PATH = the root of another checkout of onceq, e.g. a
detached `git worktree` of the commit before a change). The bench's own code (its
baseline, its ceiling, how it measures) stays the one of *this* checkout, so both
onceq figures are taken the same way, interleaved in the same run on the same machine:
only onceq's code differs. Comparing two separate runs instead measures the machine's
mood as much as the change (BENCHMARKS.md's issue 6 section had to warn about that).

How the other code runs: in a child process with that checkout's interpreter
(`PATH/.venv/bin/python` when it exists, else this one) and `PATH/src` first on
PYTHONPATH; the child imports this bench module and calls one of its functions, which
times the work itself and returns its figure as JSON. A child that resolves `onceq`
anywhere but PATH/src is refused, so a stale install can never pass for the other code.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
# The child's one output line starts with this, so that anything onceq prints on stdout
# (a summary, a note) cannot be mistaken for the result.
MARK = "@@bench-result "
CHILD = (
    "import json, sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "module = __import__(sys.argv[2])\n"
    "result = getattr(module, sys.argv[3])(*json.loads(sys.stdin.read()))\n"
    f"print({MARK!r} + json.dumps(result), flush=True)\n"
)


def _commit(root: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    sha = out.stdout.strip() or "?"
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return sha + ("+changes" if dirty else "")


@dataclass(frozen=True)
class Checkout:
    """A checkout of onceq whose code a bench can run (its own interpreter, its src/)."""

    root: Path
    python: str
    commit: str

    @property
    def label(self) -> str:
        return f"{self.root.name}@{self.commit}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment in which `python -m onceq` and `import onceq` mean this checkout."""
        env = dict(os.environ if base is None else base)
        rest = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(self.root / "src") + (os.pathsep + rest if rest else "")
        return env

    def call(self, module: str, function: str, *args: Any, timeout: float = 600) -> Any:
        """`module.function(*args)` from bench/, run with this checkout's onceq; its JSON result."""
        done = subprocess.run(
            # The arguments go through stdin: 5,000 file paths exceed the kernel's argv limit.
            [self.python, "-c", CHILD, str(BENCH), module, function],
            input=json.dumps(args), capture_output=True, text=True, env=self.env(),
            timeout=timeout, check=False,
        )  # fmt: skip
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(MARK)]
        if done.returncode != 0 or not lines:
            sys.exit(
                f"bench: {module}.{function} with {self.label} exited {done.returncode}:"
                f" {done.stderr.strip()[-2000:]}"
            )
        return json.loads(lines[-1][len(MARK) :])


def here() -> Checkout:
    """This process's onceq (the checkout the bench is run from)."""
    import onceq

    root = Path(onceq.__file__).resolve().parents[2]
    return Checkout(root, sys.executable, _commit(root))


def open_checkout(path: str | Path) -> Checkout:
    """The checkout at `path`; exits with one line when its onceq cannot be imported from it."""
    root = Path(path).resolve()
    if not (root / "src" / "onceq" / "__init__.py").is_file():
        sys.exit(f"bench: --compare {path}: no src/onceq/ there (not a checkout of onceq)")
    venv = root / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    co = Checkout(root, python, _commit(root))
    done = subprocess.run(
        [python, "-c", "import onceq; print(onceq.__file__)"],
        capture_output=True, text=True, env=co.env(), check=False,
    )  # fmt: skip
    found = Path(done.stdout.strip() or "/").resolve()
    if done.returncode != 0 or not found.is_relative_to(root / "src"):
        sys.exit(
            f"bench: --compare {path}: {python} imports onceq from"
            f" {done.stdout.strip() or done.stderr.strip()[-300:]}, not from {root / 'src'}"
        )
    return co


# The restructuring of issue 18 moved every internal module (onceq.dirq.run,
# onceq.amqp.publisher … became onceq._exercise.dirq_batch, onceq._sources.amqp.publisher …):
# a bench's onceq side uses `import onceq` or the CLI, which did not move, wherever they
# do the same work; the few steps that have no public form name both homes, this
# checkout's first, and this finds whichever the checkout running it has.
def internal(new: str, old: str) -> Any:
    """The object at "module:name" `new` (this layout), else at `old` (54cd683 and before)."""
    for where in (new, old):
        module, _, name = where.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:  # only the module asked for may be missing
            if not exc.name or not (module + ".").startswith(exc.name + "."):
                raise
    raise ImportError(f"bench: neither {new} nor {old} in this onceq")


def add_argument(parser: Any) -> None:
    parser.add_argument(
        "--compare",
        metavar="PATH",
        help="also run onceq's side with the checkout at PATH (its .venv, its src/),"
        " interleaved, and print both side by side",
    )
