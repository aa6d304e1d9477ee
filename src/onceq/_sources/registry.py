"""The source types: what the generic layers ask of a kind of source.

A flow's `source` is a configuration object (`DirSource`, `RabbitSource`) or a
transport object a library user built (`MemoryTransport`, their own). Each kind has
one `SourceType` in its own package, holding everything about itself; the generic
layers (flows, ops, the CLI's generic commands) ask this registry for the flow's
type and call it, and never test a source's class or kind themselves. A new kind of
source is a package with a `SourceType` and one line in `BUILTIN` (or a `register()`
call from the user's code or a test): no module of core, ledger, effects, flows or
ops changes.

Types are found by the class of the flow's source object (`of`) or by the name a
flow file writes (`named`). The built-in types load on first use, so `onceq --help`
does not import aio-pika.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq._core import faults
from onceq._core.logs import EVENTS
from onceq._sources.feed import Feed

if TYPE_CHECKING:
    from onceq._core.keys import Mistakes
    from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection

__all__ = [
    "BUILTIN",
    "SourceType",
    "check_fault",
    "kinds",
    "log_events",
    "named",
    "of",
    "register",
    "types",
    "unregister",
]


class SourceType:
    """One kind of source, as the generic layers see it. Subclasses override what they have.

    `kind` is the flow file's `source = "…"` and the ledger's `source` tag of a flow's
    rows; `config` the class of a flow's `source` object (None: any object `accepts`).
    """

    kind: str = ""
    config: type | None = None
    # A kind users name (a flow file's `source`, `onceq status`'s "source"); False for
    # a library's own transport object.
    public: bool = True
    # The flow-file keys of this kind's section, beside the keys every flow has.
    file_keys: frozenset[str] = frozenset()
    # This kind's own fault-injection points (onceq._core.faults): name -> the window
    # it marks. Declared when the type is loaded; the engine's three are the core's.
    fault_points: dict[str, str] = {}  # noqa: RUF012  (read only, a class-level table)
    # This kind's own log events (`extra={"event": …}` of its modules): name -> meaning.
    # onceq._core.logs.EVENTS holds the engine's and those every broker source shares.
    log_events: dict[str, str] = {}  # noqa: RUF012

    def accepts(self, source: object) -> bool:
        return self.config is not None and isinstance(source, self.config)

    # -- a flow -------------------------------------------------------------------
    def validate(self, source: Any, flow: Any, where: str) -> str | None:
        """What is wrong with this source in `flow` (one line after `where: `), or None."""
        return None

    def copies(self, source: Any) -> int:
        """Consumers of this source one run starts in this process (dirq: its workers)."""
        return 1

    def from_table(self, table: dict[str, Any], where: str, base: Path, m: Mistakes) -> Any | None:
        """The source object a flow file's section describes; mistakes go into `m`."""
        raise NotImplementedError(f"a {self.kind} source cannot be written in a flow file")

    # -- what ops reads -------------------------------------------------------------
    def depth_reader(self, flow: Any, transport: Any) -> Any | None:
        """The reader of this flow's queue depths for /metrics, or None (none to read)."""
        return None

    async def status_depths(
        self, flow: Any, api: str | None, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(the queue's depths for `onceq status`, None) or (None, why there are none)."""
        return None, "not a queue onceq status can read (a library transport)"

    def problem(self, flow: Any, transport: Any) -> str | None:
        """Why this flow's running consumer is unhealthy for /healthz, from its source, or None."""
        return None

    def labelled_depths(self, queue: dict[str, Any]) -> list[dict[str, Any]]:
        """`status_depths`'s doc as the console's columns, in order: [{"key", "label",
        "value", "unit"}]; kinds that mean the same share a key ("dead"), `unit` is None
        or "s". The page shows whatever a kind gives, so a new kind needs no page change."""
        return []

    # -- dead letters (the console; onceq._sources.dead_api) -----------------------------
    # What the console may do with this kind's dead letters: "replay", "purge".
    dead_actions: frozenset[str] = frozenset()

    async def dead_items(
        self, flow: Any, ledger: Any, selection: DeadSelection, *, bodies: bool = False
    ) -> list[DeadItem]:
        """The flow's dead letters the selection matches, left where they are."""
        raise NotImplementedError(f"a {self.kind} source has no dead letters onceq can read")

    async def dead_action(
        self, action: str, flow: Any, ledger: Any, selection: DeadSelection
    ) -> DeadAction:
        """Replay or purge the selected dead letters, by the code of this kind's own
        commands (ledger reset, confirmed copy, audit row); only `dead_actions`."""
        raise NotImplementedError(f"a {self.kind} source cannot {action} dead letters")

    # -- the command line -------------------------------------------------------------
    def flag_keys(self) -> dict[str, str]:
        """{click's parameter name: this kind's flow key} for its consume command's
        flags (`--workers` → `workers`): the flags feed the same builder as a flow file."""
        return {}

    # -- a run (onceq._flows.runner) ------------------------------------------------------
    def open(self, flow: Any, until_empty: bool) -> Feed:
        """The flow's source opened for one consumer of a run: what the runner drives.

        The base: a library user's own transport object, run as it is.
        """
        return Feed(flow.source)

    def processes(self, source: Any) -> int:
        """Consumer processes a run of this one flow forks (`dirq consume --workers N`)."""
        return 1

    def fan_out(self, n: int, child: Callable[..., Any], watch: Any, ctx: Any) -> Any:
        """Run `child(i, report)` in n processes: (the summed Stats, the first stop signal
        or None); `watch` is the parent's telemetry (onceq._sources.dirq.run.fan_out)."""
        raise NotImplementedError(f"a {self.kind} source runs in one process")


# kind -> "module:attribute" of its SourceType instance, imported on first use.
BUILTIN: dict[str, str] = {
    "dirq": "onceq._sources.dirq.plugin:DIRQ",
    "rabbitmq": "onceq._sources.amqp.plugin:RABBITMQ",
    "nats": "onceq._sources.nats.plugin:NATS",
    "transport": "onceq._sources.library:TRANSPORT",
}

_loaded: dict[str, SourceType] = {}
_extra: list[str] = []  # kinds registered beyond the built-in ones, in registration order
_fault_checked = False  # every built-in type loaded once to check an armed ONCEQ_FAULT


def register(source_type: SourceType) -> SourceType:
    """Add (or replace) a source type; returns it, so it can decorate an instance."""
    if not source_type.kind:
        raise ValueError("a SourceType needs a kind")
    faults.declare(source_type.kind, source_type.fault_points)
    if source_type.kind not in BUILTIN and source_type.kind not in _extra:
        _extra.append(source_type.kind)
    _loaded[source_type.kind] = source_type
    return source_type


def unregister(kind: str) -> None:
    """Forget a kind `register` added (a test's own source type), its fault points
    with it. A built-in kind is loaded again (and declares its points) on its next use."""
    _loaded.pop(kind, None)
    faults.forget(kind)
    if kind in _extra:
        _extra.remove(kind)


def _load(kind: str) -> SourceType:
    t = _loaded.get(kind)
    if t is None:
        module, _, attr = BUILTIN[kind].partition(":")
        t = _loaded[kind] = getattr(importlib.import_module(module), attr)
        faults.declare(kind, t.fault_points)
        check_fault()
    return t


def check_fault() -> None:
    """Refuse an armed ONCEQ_FAULT that no source declares (`UsageError`, exit 2).

    Asked as each type loads (every run asks for its source's type first) and by the
    CLI's root before any command, so one that reaches a point outside a consume run
    (`dirq replay`: mid-replay) refuses a mistyped name too, rather than running to the
    end and letting a crash test pass that never crashed. A point of the engine or of
    a type already loaded costs nothing; any other may be another built-in kind's, so
    all of them are loaded then — only in a crash test, so a run still imports its own
    source's package alone.
    """
    global _fault_checked
    if _fault_checked or not faults.pending():
        return
    _fault_checked = True
    for kind in BUILTIN:
        _load(kind)
    faults.check()


def _order() -> list[str]:
    """Every kind, the built-in ones first (in every list a user reads), all loaded."""
    for kind in BUILTIN:
        _load(kind)
    return [*BUILTIN, *_extra]


def types() -> list[SourceType]:
    """Every registered type, the most specific first (the generic transport last)."""
    return sorted((_loaded[k] for k in _order()), key=lambda t: t.config is None)


def named(kind: str) -> SourceType | None:
    """The type a flow file names (`source = "dirq"`), or None."""
    if kind in BUILTIN:
        return _load(kind)
    return _loaded.get(kind)


def of(source: object) -> SourceType | None:
    """The type of a flow's source object, or None (not a source at all)."""
    # A built-in source's object is defined in its type's module, which is then
    # imported already: that type alone is asked first. A run of one kind does
    # not import every other kind's package (tens of milliseconds of a short
    # batch's start-up, aio-pika's modules for a directory queue).
    module = type(source).__module__
    for kind, where in BUILTIN.items():
        if where.partition(":")[0] == module:
            t = _load(kind)
            if t.accepts(source):
                return t
    for t in types():
        if t.accepts(source):
            return t
    return None


def log_events() -> dict[str, str]:
    """Every log event an operator may see: the engine's, then each type's own."""
    out = dict(EVENTS)
    for kind in _order():
        out.update(_loaded[kind].log_events)
    return out


def kinds() -> list[str]:
    """The kinds a user can name, in registration order (for a flow file's error message)."""
    return [k for k in _order() if _loaded[k].public]
