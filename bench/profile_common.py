"""What the *_profile.py scripts share: running a side's process under a tool, and
reading what the tool counted.

    callgrind  valgrind --tool=callgrind: instructions, the same count whatever else
               the machine runs (leaves callgrind.out.LABEL in OUT)
    cprofile   python -m cProfile (LABEL.prof: which Python functions take the time)
    py-spy     samples at full speed (LABEL.txt, raw; PY_SPY=path if not on PATH);
               `gil=True`: only the thread holding the GIL, what serialises the run
    strace     strace -f -c (LABEL.strace: system calls by name; `strace_counts`)
    wrap       any command that runs the rest of its arguments (ONCEQ_WRAP)
    none       the process alone (CPU and wall time)
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

TOOLS = ["callgrind", "cprofile", "py-spy", "strace", "wrap", "none"]


def wrapper(tool: str, out: Path, label: str, gil: bool = False) -> list[str]:
    """The command line that runs a process under `tool`, before the process's own."""
    if tool == "callgrind":
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.out.{label}"]
    if tool == "wrap":
        return os.environ["ONCEQ_WRAP"].split()
    if tool == "py-spy":
        spy = os.environ.get("PY_SPY", "py-spy")
        which = ["--gil", "-r", "2000"] if gil else ["-r", "1000"]
        return [spy, "record", *which, "-f", "raw", "-o", str(out / f"{label}.txt"), "--"]
    if tool == "strace":
        return ["strace", "-f", "-c", "-o", str(out / f"{label}.strace")]
    return []


def python_args(tool: str, out: Path, label: str) -> list[str]:
    """What goes between the interpreter and its script (cProfile's module)."""
    return ["-m", "cProfile", "-o", str(out / f"{label}.prof")] if tool == "cprofile" else []


def instructions(stderr: str) -> int:
    """callgrind's total, from what it printed; exits when it printed none."""
    found = re.search(r"Collected : (\d+)", stderr)
    if not found:
        sys.exit(f"bench: no instruction count in callgrind's output: {stderr[-2000:]}")
    return int(found.group(1))


def run_wrapped(
    cmd: list[str], env: dict[str, str] | None, tool: str, out: Path, label: str,
    timeout: float = 1200,
) -> tuple[int | None, float]:  # fmt: skip
    """Run `cmd` (a python command line) under `tool`: (instructions when callgrind, CPU
    seconds of the process and its children)."""
    python, *rest = cmd
    full = [*wrapper(tool, out, label), python, *python_args(tool, out, label), *rest]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(full, env=env, capture_output=True, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    print(f"  {label}: CPU user {user:.2f}s system {system:.2f}s", end="")
    if done.returncode != 0:
        sys.exit(f"bench: {label} exited {done.returncode}: {done.stderr[-3000:]}")
    if tool != "callgrind":
        return None, user + system
    return instructions(done.stderr), user + system


def strace_counts(path: Path) -> dict[str, int]:
    """`strace -c`'s table: calls by syscall name."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        cols = line.split()
        if len(cols) >= 5 and cols[0][0].isdigit() and cols[-1] != "total":
            # % time, seconds, usecs/call, calls, [errors], syscall
            counts[cols[-1]] = int(cols[3])
    return counts


def print_per_message(
    side: str, counts: list[int], cpus: list[float], irs: list[int | None], tool: str
) -> None:
    """What one more message costs: the difference of the two runs over the difference
    of their counts (start-up and the tool's own set-up cancel out)."""
    if len(counts) != 2:
        return
    (n1, n0), (c1, c0), (i1, i0) = counts, cpus, irs
    if tool == "none":
        print(f"{side}: {(c1 - c0) / (n1 - n0) * 1e6:,.0f} us CPU per message")
    if i1 is not None and i0 is not None:
        print(f"{side}: {(i1 - i0) / (n1 - n0):,.0f} instructions per message")
