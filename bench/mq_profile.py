"""Instructions per message on RabbitMQ: onceq's consumer, or its ceiling, counted.

    python bench/mq_profile.py own|preset|ceiling [--messages 3000,1000] [--prefetch 50]
                               [--tool callgrind|cprofile|py-spy|wrap|none] [--out DIR]

The machine is shared and CPU time moves with other work; instructions do not. Each
side is run once per message count as a process of its own under the tool, over n
claims queued beforehand in a vhost of its own (`onceq mq topology`, the claim stub
listening with --delay 0, as in bench/mq_end_to_end.py), until the queue is drained:

- own: a user's own flow, `onceq run FILE --until-empty` (mq_common.OWN_FLOW: the
  generic HTTP effect, the id from the message_id property) — mq_end_to_end's
  headline row;
- preset: the claims preset, `onceq mq consume --claim URL --until-empty`;
- ceiling: mq_common.bare_consumer (bare aiormq + aiohttp, the same grouped SQLite
  commit before a multiple ack) in a process of its own.

The difference of two counts over the difference of the messages is what one more
message costs, start-up, the drain's last wait and the tool's own set-up gone:

    instr/msg = (Ir(3000) - Ir(1000)) / 2000

With callgrind the run also leaves callgrind.out.<side>-<n> in --out (callgrind_annotate
reads them); with cprofile it leaves <side>-<n>.prof (pstats: which Python functions
take the time). Every run is checked as the benches check theirs: the queue empty with
nothing unacked, the stub one 201 per claim, the ledger one row per claim.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import mq_common as mc
from profile_common import TOOLS, print_per_message, run_wrapped

HERE = Path(__file__).resolve().parent


def consume_once(
    side: str,
    n: int,
    prefetch: int,
    tool: str,
    out: Path,
    work: Path,
    own_extra: tuple[str, ...] = (),
) -> tuple[int | None, float]:
    label = f"{side}-{n}"
    with mc.temp_vhost("prof") as vhost, mc.stub(0.0) as claim:
        mc.topology(vhost)
        mc.publish(vhost, mc.write_claims(work / f"claims-{label}", n, label))
        db = work / f"{label}.db"
        table = "messages"
        if side == "ceiling":
            cmd = [sys.executable, str(HERE / "mq_profile.py"), "--bare-run", vhost.url, claim,
                   str(n), str(prefetch), str(db)]  # fmt: skip
            table = "processed"
        elif side == "preset":
            cmd = [sys.executable, "-m", "onceq", "mq", "consume", "--claim", claim,
                   "--prefetch", str(prefetch), "--db", str(db), "--until-empty", "--json",
                   "--max-seconds", "900"]  # fmt: skip
            table = "processed"
        else:
            flow = db.with_suffix(".toml")
            text = mc.OWN_FLOW.format(db=db, prefetch=prefetch, url=f"{claim}/v1/claims")
            flow.write_text(text + "".join(f"{line}\n" for line in own_extra))
            cmd = [sys.executable, "-m", "onceq", "run", str(flow), "--until-empty", "--json",
                   "--max-seconds", "900"]  # fmt: skip
        ir, cpu = run_wrapped(cmd, vhost.env(), tool, out, label)
        span = mc.ledger_span(db, table=table)
        print(f"; {span.commits} commits, {span.group:.1f} messages per commit")
        ready, unacked = mc.depth(vhost)
        calls = mc.stub_stats(claim)["by_status"].get("201", 0)
        recorded = mc.ledger_count(db, table)
        if ready or unacked or calls != n or recorded != n:
            sys.exit(f"bench: {label}: queue {ready} ready / {unacked} unacked,"
                     f" stub 201s {calls}/{n}, ledger {recorded}")  # fmt: skip
    return ir, cpu


def bare_run(url: str, claim: str, n: int, prefetch: int, db: str) -> int:
    """The ceiling as a process of its own (the tool counts this process only)."""
    mc.bare_consumer(mc.Vhost("prof", url), claim, n, prefetch, db=Path(db))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--bare-run":
        url, claim, n, prefetch, db = sys.argv[2:7]
        return bare_run(url, claim, int(n), int(prefetch), db)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("side", choices=["own", "preset", "ceiling"])
    ap.add_argument("--messages", default="3000,1000", help="two counts: more,fewer")
    ap.add_argument("--prefetch", type=int, default=50)
    ap.add_argument("--tool", choices=TOOLS, default="callgrind")
    ap.add_argument("--out", default=".", help="where the tool's files go")
    ap.add_argument(
        "--own-line",
        action="append",
        default=[],
        help="own: one more line for the flow file's [flows.claims.http] (e.g. 'concurrency = 50')",
    )
    args = ap.parse_args()
    counts = [int(x) for x in args.messages.split(",")]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    mc.require_broker()
    irs, cpus = [], []
    with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp:
        for n in counts:
            ir, cpu = consume_once(
                args.side, n, args.prefetch, args.tool, out, Path(tmp), tuple(args.own_line)
            )
            irs.append(ir)
            cpus.append(cpu)
            print(f"{args.side} {n}: " + ("done" if ir is None else f"{ir:,} instructions"))
    print_per_message(args.side, counts, cpus, irs, args.tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
