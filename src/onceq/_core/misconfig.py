"""The misconfiguration guard: a run whose first messages all fail the same way stops.

A typo in `--id-field`, a wrong URL path (404) or a refused token (401/403) fails
every message permanently, for the same reason: without this guard the run would
quarantine (or dead-letter) the whole queue and recovering would take a replay of
everything. So the loop (onceq._core.consumer) feeds each verdict it reaches to a
`MisconfigGuard`, in the order it reaches them, and the guard decides:

| verdict among the first N              | the guard                                   |
| REJECTED, the same reason as the first | counts it; the N-th trips it (stop the run) |
| REJECTED, another reason               | disarmed for the rest of the run            |
| SUCCESS, DUPLICATE, TRANSIENT          | disarmed for the rest of the run            |
| HELD (breaker open, ledger away)       | not a verdict: ignored                      |

"The same reason": the same `reason` word (`http-404`, `parse` …); for
`missing-field`, at least one field missing from every one of them (the detail is
the list of missing fields). It is only about the *first* messages: once disarmed
(or past N) it never trips, so a queue with some bad messages among good ones runs
as before. The decision is pure (no I/O, no clock; `feed` returns True on the verdict
that trips it); the count lives in a `Tally`, which the --workers children of one run
share (`SharedTally`). "The first N" of a run and the bound on what it lets through
(N + the calls in flight): docs/architecture.md, "The misconfiguration guard".

`GuardPolicy` is what a flow says (on, N); `exercise` marks the exercises' presets,
whose rule is that every bad message is quarantined and the run goes on (and ends 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from onceq._core.transport import Kind
from onceq.errors import AllFailed, Misconfigured, OnceqError, UsageError, redact_url

if TYPE_CHECKING:
    from onceq._core.stats import Stats

# Ten: far more than the odd bad message a healthy queue starts with (it takes ten
# in a row, all failing the same way, with not one success, duplicate or retry among
# them), and few enough that a replay of what it let through is a small job.
DEFAULT_FAILURES = 10
MAX_FAILURES = 100_000
# Released untried after the guard stopped the run (the reason of a HELD outcome).
GUARD_HELD = "guard-stopped"
# The hint lists at most this many field names, each cut to this length.
MAX_KEYS = 30
MAX_KEY_CHARS = 40


@dataclass(frozen=True)
class GuardPolicy:
    """Stop a run whose first `failures` messages all fail permanently the same way.

    `enabled=False`: never stop (every failing message is dead-lettered, as before).
    `exercise`: the exercise presets' rule (the guard off, and a batch in which every
    message failed still ends 0: the exercise checks the folders, not an exit code).
    """

    enabled: bool = True
    failures: int = DEFAULT_FAILURES
    exercise: bool = False
    # Set only inside a --workers child: the count its siblings share (not config).
    shared: TallyStore | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int):
            raise UsageError(f"guard: failures must be a whole number, not {self.failures!r}")
        if not 1 <= self.failures <= MAX_FAILURES:
            raise UsageError(f"guard: failures must be 1-{MAX_FAILURES}, not {self.failures}")

    @classmethod
    def off(cls) -> GuardPolicy:
        return cls(enabled=False)

    @classmethod
    def exercise_rule(cls) -> GuardPolicy:
        """The presets' (orders, claims, the lab's scripts): every bad file quarantined."""
        return cls(enabled=False, exercise=True)


def top_level_keys(body: bytes | None) -> tuple[str, ...]:
    """The keys of a JSON object's top level (never a value); () for anything else."""
    if not body:
        return ()
    try:
        doc = json.loads(body.decode("utf-8-sig"))
    except (ValueError, RecursionError):
        return ()
    return tuple(doc) if isinstance(doc, dict) else ()


def _name(key: str) -> str:
    """A field name fit for one line: control characters escaped, long names cut."""
    text = (
        key.encode("unicode_escape", "backslashreplace").decode("ascii")
        if not key.isprintable()
        else key
    )
    return text if len(text) <= MAX_KEY_CHARS else text[: MAX_KEY_CHARS - 1] + "…"


ARMED, DISARMED, TRIPPED = 0, 1, 2


def _step(state: int, count: int, first: str, reason: str, failures: int) -> tuple[int, int, str]:
    """(state, count, reason) after one more permanent failure for `reason`: the one
    rule both tallies follow (a SharedTally under its lock)."""
    if state != ARMED:
        return state, count, first
    if count and reason != first:
        return DISARMED, count, first
    count += 1
    return (TRIPPED if count >= failures else ARMED), count, reason


class TallyStore(Protocol):
    """What a guard reads and writes of its tally: a `Tally` or a `SharedTally`.

    count, state and reason change only through add and disarm (read-only here: a
    SharedTally's live in shared memory, behind its lock); hint is set by the tripper.
    """

    @property
    def count(self) -> int: ...

    @property
    def state(self) -> int: ...

    @property
    def reason(self) -> str: ...

    hint: str

    def add(self, reason: str, failures: int) -> int: ...

    def disarm(self) -> None: ...


class Tally:
    """The run's count of first failures alike, and its state (ARMED, DISARMED, TRIPPED).

    One consumer's own by default. The --workers children of one `dirq consume` share
    a `SharedTally` instead: "the first N" are then the first N verdicts of the whole
    run, whichever child reached them.
    """

    def __init__(self) -> None:
        self.count = 0
        self.reason = ""
        self.state = ARMED
        self.hint = ""  # the tripping consumer's hint, for every consumer of the run

    def add(self, reason: str, failures: int) -> int:
        """One more permanent failure for `reason`; the state after it."""
        self.state, self.count, self.reason = _step(
            self.state, self.count, self.reason, reason, failures
        )
        return self.state

    def disarm(self) -> None:
        if self.state == ARMED:
            self.state = DISARMED


class SharedTally:
    """A Tally in shared memory for forked consumer processes (one lock, three values)."""

    def __init__(self, ctx: Any) -> None:
        self._lock = ctx.Lock()
        self._count = ctx.RawValue("i", 0)
        self._state = ctx.RawValue("i", ARMED)
        self._reason = ctx.RawArray("c", 64)  # a reason is a short ASCII word
        self._hint = ctx.RawArray("c", 4096)

    @property
    def count(self) -> int:
        return int(self._count.value)

    @property
    def state(self) -> int:
        return int(self._state.value)

    @property
    def reason(self) -> str:
        return bytes(self._reason.value).decode("ascii", "replace")

    @property
    def hint(self) -> str:
        return bytes(self._hint.value).decode("utf-8", "replace")

    @hint.setter
    def hint(self, text: str) -> None:
        self._hint.value = text.encode("utf-8", "replace")[:4095]

    def add(self, reason: str, failures: int) -> int:
        word = reason.encode("ascii", "replace")[:63].decode("ascii")  # as it is stored
        with self._lock:
            state, count, first = _step(
                int(self._state.value), int(self._count.value), self.reason, word, failures
            )
            self._state.value, self._count.value = state, count
            self._reason.value = first.encode("ascii")
            return state

    def disarm(self) -> None:
        with self._lock:
            if self._state.value == ARMED:
                self._state.value = DISARMED


@dataclass
class MisconfigGuard:
    """The decision for one consumer's run (see the module). `url`: the effect's URL,
    named in a 404/401/403 hint (its password masked); `id_field`: the flow's id;
    `tally`: where the count is kept (shared by the --workers of one run)."""

    policy: GuardPolicy = field(default_factory=GuardPolicy)
    url: str | None = None
    id_field: str | None = None
    tally: TallyStore = field(default_factory=Tally)
    reason: str = ""
    disarmed: bool = False
    tripped: bool = False
    tripped_here: bool = False  # by this consumer's own verdict (not a sibling's)
    missing: set[str] | None = None  # missing-field: the fields every failure lacked
    keys: set[str] = field(default_factory=set)  # the failures' top-level keys

    @property
    def count(self) -> int:
        return self.tally.count

    @property
    def armed(self) -> bool:
        return self.policy.enabled and not self.disarmed and not self.tripped

    @property
    def stopped(self) -> bool:
        """Tripped, here or by another consumer of the run (a shared tally)."""
        if self.disarmed:  # the common case, once per message: no look at the tally
            return False
        if not self.tripped and self.policy.enabled and self.tally.state == TRIPPED:
            self.tripped = True
        return self.tripped

    def feed(
        self, kind: Kind, reason: str = "", detail: str = "", body: bytes | None = None
    ) -> bool:
        """One verdict, in the order the loop reached it; True when this one trips the guard."""
        if not self.armed or kind is Kind.HELD:
            return False
        state = self.tally.state
        if state != ARMED:  # another consumer of the run decided first
            self.tripped, self.disarmed = state == TRIPPED, state == DISARMED
            return self.tripped
        if kind is not Kind.REJECTED or (self.reason and reason != self.reason):
            return self._disarm()
        if reason == "missing-field":
            fields = {f for f in detail.split(",") if f}
            self.missing = fields if self.missing is None else self.missing & fields
            if not self.missing:  # no field missing from all of them: not one cause
                return self._disarm()
        if reason in ("missing-field", "missing-id"):
            self.keys.update(top_level_keys(body))
        self.reason = reason
        state = self.tally.add(reason, self.policy.failures)
        self.tripped, self.disarmed = state == TRIPPED, state == DISARMED
        self.tripped_here = self.tripped
        return self.tripped

    def _disarm(self) -> bool:
        self.disarmed = True
        self.tally.disarm()
        return False

    def hint(self) -> str:
        """One line: what is probably misconfigured (only meaningful once tripped).

        The tripping consumer's, when another consumer of the run tripped first (it
        saw the messages: their fields, the missing one).
        """
        if self.tripped_here:
            self.tally.hint = self._hint()
            return self.tally.hint
        return self.tally.hint or self._hint()

    def _hint(self) -> str:
        reason = self.reason or self.tally.reason or "?"  # tripped by a sibling: its reason
        head = f"the first {self.count} message(s) all failed with {reason}"
        where = redact_url(self.url) if self.url else "the partner"
        if reason in ("missing-field", "missing-id"):
            missing = sorted(self.missing or ()) or [self.id_field or "the id"]
            names = sorted(self.keys)
            shown = ", ".join(_name(k) for k in names[:MAX_KEYS])
            if len(names) > MAX_KEYS:
                shown += f", … {len(names) - MAX_KEYS} more"
            have = f"the fields they have: {shown}" if shown else "they have no JSON fields"
            which = "id field" if missing == [self.id_field] else "field"
            what = f"no message has the {which} {', '.join(_name(m) for m in missing)} ({have})"
        elif reason == "http-404":
            what = f"{where} answers 404 Not Found: is the URL right?"
        elif reason in ("http-401", "http-403"):
            what = f"{where} refuses the credentials ({reason[5:]}): check the token/headers"
        else:
            # No detail: a partner's answer may quote the message; `dead list` shows it.
            what = "the same rejection every time (the dead letters' detail says more)"
        return f"misconfigured? {head}: {what}"


def stopped_error(stats: Stats, where: str) -> Misconfigured:
    """The one line (and exit 10) of a run the guard stopped: its hint, what it lost."""
    return Misconfigured(
        f"{where}: {stats.misconfigured}; stopped with {stats.dead} {stats.dead_word},"
        " the rest untouched: fix it and run again",
        stats,
    )


def run_error(policy: GuardPolicy, stats: Stats, *, batch: bool, where: str) -> OnceqError | None:
    """The error a finished run ends with (None: exit 0), after its summary is printed.

    Misconfigured (10) when the guard stopped it; AllFailed (11) when a batch that
    was to finish its queue received messages and every one failed, except under
    the exercise presets' rule (the exercise's scripts end 0 whatever the files were).
    """
    if stats.misconfigured:
        return stopped_error(stats, where)
    if batch and stats.all_failed and not policy.exercise:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats.reasons.items()))
        return AllFailed(
            f"{where}: every message failed: {stats.dead} {stats.dead_word} ({reasons})", stats
        )
    return None
