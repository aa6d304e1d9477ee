"""Instructions per message on NATS: onceq's consume or publish, or its ceiling, counted.

    python bench/nats_profile.py consume|ceiling|publish|publish-ceiling
                                 [--messages 3000,1000] [--prefetch 50] [--window 256]
                                 [--tool callgrind|cprofile|none] [--out DIR]

The machine is shared and CPU time moves with other work; instructions do not. Each
side is run once per message count as a process of its own under the tool (the queue
filled, the claim stub listening, beforehand, as in bench/nats_end_to_end.py and
bench/nats_publish_rate.py), and the difference of two counts over the difference of
the messages is what one more message costs, start-up and the tool's own set-up gone:

    instr/msg = (Ir(3000) - Ir(1000)) / 2000

With callgrind the run also leaves callgrind.out.<side>-<n> in --out (callgrind_annotate
reads them: which C functions, nats-py's parser, SQLite, the interpreter's own loop,
take the instructions); with cprofile it leaves <side>-<n>.prof (pstats: which Python
functions). Every run is checked as the benches check theirs: the stream empty and the
consumer holding nothing, the stub one 201 per claim, the stream holding n messages
after a publish.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import mq_common as mc
import nats_common as nc
from profile_common import TOOLS, print_per_message, run_wrapped

HERE = Path(__file__).resolve().parent


def consume_once(
    side: str, n: int, prefetch: int, tool: str, out: Path, work: Path
) -> tuple[int | None, float]:
    label = f"{side}-{n}"
    with mc.stub(0.0) as claim, nc.temp_stream(side) as s:
        if side in ("ceiling", "transport-bare"):
            nc.run(nc.add_stream(s))
        else:
            nc.setup(sys.executable, s)
        nc.run(nc.fill(s, mc.write_claims(work / f"claims-{label}", n, label)))
        db = work / f"{label}.db"
        if side.startswith("transport"):
            cmd = [sys.executable, str(HERE / "nats_transport_loop.py"),
                   "bare" if side == "transport-bare" else "ours", nc.URL, s.name, s.durable,
                   str(n), str(prefetch)]  # fmt: skip
        elif side == "ceiling":
            cmd = [sys.executable, str(HERE / "nats_end_to_end.py"), "--bare-run", s.name,
                   s.durable, claim, str(n), str(prefetch), str(db)]  # fmt: skip
        else:
            cmd = [sys.executable, "-m", "onceq", "nats", "consume", "--stream", s.name,
                   "--durable", s.durable, "--url", f"{claim}/v1/claims", "--id-field",
                   nc.ID_FIELD, "--prefetch", str(prefetch), "--db", str(db),
                   "--until-empty", "--json", "--max-seconds", "600"]  # fmt: skip
        ir, cpu = run_wrapped(cmd, nc.env(), tool, out, label, timeout=900)
        if db.exists():
            span = nc.messages_span(db)
            print(f"; {span.commits} commits, {span.group:.1f} messages per commit")
        else:
            print()
        messages, pending, unacked = nc.run(nc.state(s))
        calls = mc.stub_stats(claim)["by_status"].get("201", 0)
        recorded = nc.messages_count(db)
        if side.startswith("transport"):  # no call, no ledger: the stream alone tells
            calls = recorded = n
        if messages or pending or unacked or calls != n or recorded != n:
            sys.exit(f"bench: {label}: stream {messages}, pending {pending}, unacked {unacked},"
                     f" stub 201s {calls}/{n}, ledger {recorded}")  # fmt: skip
    return ir, cpu


def publish_once(
    side: str, n: int, window: int, tool: str, out: Path, work: Path
) -> tuple[int | None, float]:
    import nats_publish_rate as pr

    label = f"{side}-{n}"
    with nc.temp_stream("pub") as s:
        nc.run(nc.add_stream(s, consumer=False))
        paths = [str(p) for p in mc.write_claims(work / f"claims-{label}", n, label)]
        if side == "publish-ceiling":
            cmd = [sys.executable, "-c", pr.BARE_PUBLISHER, nc.URL, s.subject, s.name,
                   str(window), *paths]  # fmt: skip
        else:
            cmd = [sys.executable, "-m", "onceq", "nats", "publish", *paths, "--subject",
                   s.subject, "--id-field", nc.ID_FIELD, "--window", str(window),
                   "--json"]  # fmt: skip
        ir, cpu = run_wrapped(cmd, nc.env(), tool, out, label, timeout=900)
        print()
        stored = nc.run(pr._count(s))
        if stored != n:
            sys.exit(f"bench: {label}: the stream holds {stored}, expected {n}")
    return ir, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sides = ["consume", "ceiling", "transport", "transport-bare", "publish", "publish-ceiling"]
    ap.add_argument("side", choices=sides)
    ap.add_argument("--messages", default="3000,1000", help="two counts: more,fewer")
    ap.add_argument("--prefetch", type=int, default=50)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--tool", choices=TOOLS, default="callgrind")
    ap.add_argument("--out", default=".", help="where the tool's files go")
    args = ap.parse_args()
    counts = [int(x) for x in args.messages.split(",")]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nc.require_server()
    irs, cpus = [], []
    with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp:
        for n in counts:
            if not args.side.startswith("publish"):
                ir, cpu = consume_once(args.side, n, args.prefetch, args.tool, out, Path(tmp))
            else:
                ir, cpu = publish_once(args.side, n, args.window, args.tool, out, Path(tmp))
            irs.append(ir)
            cpus.append(cpu)
            print(f"{args.side} {n}: " + ("done" if ir is None else f"{ir:,} instructions"))
    print_per_message(args.side, counts, cpus, irs, args.tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
