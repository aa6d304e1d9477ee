"""Instructions per file of a directory-queue consume, or of its ceiling, counted.

    python bench/dirq_profile.py consume|ceiling|flow|flow-sql
                                 [--messages 5000,1000]
                                 [--tool callgrind|cprofile|py-spy|strace|none]
                                 [--out DIR]

The machine is shared and CPU time moves with other work; instructions do not. Each
side runs once per message count as a process of its own under the tool, over a queue
filled beforehand (bench/dirq_throughput.py's `make_queue`, untimed), doing exactly
what that bench's row does (`consume`: `onceq dirq consume`'s run; `ceiling`: the
no-fsync loop; `flow` / `flow-sql`: the invoice flow without and with its SQL effect).
The difference of two counts over the difference of the files is what one more file
costs, start-up and the tool's own set-up gone:

    instr/file = (Ir(5000) - Ir(1000)) / 4000

--tool callgrind leaves callgrind.out.<side>-<n> in --out (callgrind_annotate reads
them); cprofile leaves <side>-<n>.prof (pstats, the run alone); py-spy (PY_SPY=path
if not on PATH) leaves <side>-<n>.txt, py-spy's raw samples of the thread holding the
GIL (what serialises the run's threads); strace leaves <side>-<n>.strace
(`strace -f -c`: syscalls by name, and the per-file difference of each is printed);
each prints CPU and wall-clock microseconds per file beside (the wall clock of the
run alone, timed in the child; under a tool it is the tool's); --tool none also
splits the CPU into user and system time and counts the voluntary context switches
per file (a thread that waited: for the GIL, a lock, the disk). Every run is checked as
the throughput bench checks it: every file handled and in done/.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dirq_throughput as dt
from profile_common import TOOLS, instructions, strace_counts, wrapper

HERE = Path(__file__).resolve().parent
RUNNERS = {"consume": "ours", "ceiling": "ceiling", "flow": "flow", "flow-sql": "flow_sql"}
CHILD = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import dirq_throughput as dt\n"
    "import time\n"
    "from pathlib import Path\n"
    "run = dt.RUNNERS[sys.argv[2]]\n"
    "t0 = time.perf_counter()\n"
    "if sys.argv[5:]:\n"  # cProfile around the run alone (no start-up in the profile)
    "    import cProfile\n"
    "    prof = cProfile.Profile()\n"
    "    n = prof.runcall(run, Path(sys.argv[3]))\n"
    "    prof.dump_stats(sys.argv[5])\n"
    "else:\n"
    "    n = run(Path(sys.argv[3]))\n"
    "print('@@wall', time.perf_counter() - t0)\n"
    "assert n == int(sys.argv[4]), n\n"
)


# (user s, system s, voluntary context switches) of each run, in order: beside the
# CPU, where it goes (the kernel's share, and how often a thread waited for another).
SPLIT: list[tuple[float, float, int]] = []


def run_once(
    side: str, n: int, tool: str, out: Path, work: Path
) -> tuple[int | None, float, float]:
    label = f"{side}-{n}"
    runner = RUNNERS[side]
    root = dt.make_queue(work / label, n, dt.SHAPES.get(runner, "order"))
    cmd = [
        *wrapper(tool, out, label, gil=True),
        sys.executable,
        "-c",
        CHILD,
        str(HERE),
        runner,
        str(root),
    ]
    cmd += [str(n), *([str(out / f"{label}.prof")] if tool == "cprofile" else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    cpu = user + system
    SPLIT.append((user, system, after.ru_nvcsw - before.ru_nvcsw))
    if done.returncode != 0:
        sys.exit(f"bench: {label} exited {done.returncode}: {done.stderr[-3000:]}")
    wall = float(done.stdout.split("@@wall ")[1].split()[0])  # the run alone, in the child
    print(f"  {label}: CPU {cpu:.2f}s, the run's wall {wall:.2f}s")
    left = len(os.listdir(root / "done"))
    if left != n:
        sys.exit(f"bench: {label}: done/ holds {left}, expected {n}")
    shutil.rmtree(root, ignore_errors=True)
    if tool != "callgrind":
        return None, cpu, wall
    return instructions(done.stderr), cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("side", choices=sorted(RUNNERS))
    ap.add_argument("--messages", default="5000,1000", help="two counts: more,fewer")
    ap.add_argument("--tool", choices=TOOLS, default="callgrind")
    ap.add_argument("--out", default=".", help="where the tool's files go")
    args = ap.parse_args()
    counts = [int(x) for x in args.messages.split(",")]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    irs, cpus, walls = [], [], []
    with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp:
        for n in counts:
            ir, cpu, wall = run_once(args.side, n, args.tool, out, Path(tmp))
            irs.append(ir)
            cpus.append(cpu)
            walls.append(wall)
            print(f"{args.side} {n}: " + ("done" if ir is None else f"{ir:,} instructions"))
    if len(counts) != 2:
        return 0
    (n1, n0), (c1, c0), (i1, i0), (w1, w0) = counts, cpus, irs, walls
    print(f"{args.side}: {(c1 - c0) / (n1 - n0) * 1e6:,.1f} us CPU per file", end="")
    print(f", {(w1 - w0) / (n1 - n0) * 1e6:,.1f} us wall per file (the run alone)")
    if args.tool == "none" and len(SPLIT) == 2:  # (under a tool, its own CPU would count)
        (u1, s1, v1), (u0, s0, v0) = SPLIT
        print(
            f"{args.side}: {(u1 - u0) / (n1 - n0) * 1e6:,.1f} us user"
            f" + {(s1 - s0) / (n1 - n0) * 1e6:,.1f} us system per file,"
            f" {(v1 - v0) / (n1 - n0):.2f} voluntary context switches per file"
        )
    if i1 is not None and i0 is not None:
        print(f"{args.side}: {(i1 - i0) / (n1 - n0):,.0f} instructions per file")
    if args.tool == "strace":
        more, fewer = (strace_counts(out / f"{args.side}-{n}.strace") for n in counts)
        per = {k: (v - fewer.get(k, 0)) / (n1 - n0) for k, v in more.items()}
        shown = sorted(((v, k) for k, v in per.items() if abs(v) >= 0.01), reverse=True)
        print(f"{args.side}: syscalls per file: {sum(per.values()):.2f}")
        for v, k in shown:
            print(f"  {k:<20} {v:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
