"""The Prometheus metrics of a running consumer, read at scrape time from what it counts.

Why a collector and not Counter objects bumped by the loop: the loop already counts
every settled entry once, in `Stats` (what `--json` prints), through the one table
`onceq._core.stats.OUTCOMES`. Reading those counts when Prometheus scrapes makes
`onceq_messages_total` equal to the run's summary by construction, and costs the loop
nothing per message or per group. The only per-call cost is the effect histogram's
observe (`Durations`: a bisect and two adds, no lock: it is only touched on the loop).

The metrics live on a `CollectorRegistry` of onceq's own (`new_registry`), never the
global one, so several runs in one process (tests, `onceq.run` called twice) never
collide; the process, platform and GC collectors are registered on it too.

    onceq_messages_total{flow,outcome}        processed, duplicate, partner_duplicate,
                                              recovered, retried, held, dead
    onceq_failures_total{flow,reason}         every failure the ledger records (retried
                                              and dead), by its reason
    onceq_in_flight{flow}                     received, not yet settled
    onceq_effect_duration_seconds{flow}       histogram of the calls (flows with a call)
    onceq_breaker_open{flow}                  1 while open or half-open, else 0
    onceq_breaker_state{flow,state}           1 for the current state: closed, open,
                                              half-open
    onceq_queue_messages{flow,state}          dirq: inbox, processing, retry, error;
                                              RabbitMQ: ready, unacked, retry, dead
    onceq_oldest_message_age_seconds{flow}    dirq: the oldest file in inbox/ (0: empty)
    onceq_flow_up{flow}                       1 while the flow is healthy (/healthz's rule)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from onceq._core.breaker import CLOSED, HALF_OPEN, OPEN
from onceq._core.stats import OUTCOMES
from onceq._ops.metrics_snapshot import FlowMetrics, healthy

__all__ = ["OnceqCollector", "new_registry"]

BREAKER_STATES = (CLOSED, OPEN, HALF_OPEN)


class OnceqCollector(Collector):
    """Every flow's metrics, built at each scrape from `flows()`."""

    def __init__(self, flows: Callable[[], Iterable[FlowMetrics]]) -> None:
        self._flows = flows

    def describe(self) -> list[Metric]:
        return []  # dynamic: registering must not call collect (no flow exists yet)

    def collect(self) -> Iterator[Metric]:
        msgs = CounterMetricFamily(
            "onceq_messages", "Settled messages by final outcome.", labels=["flow", "outcome"]
        )
        fails = CounterMetricFamily(
            "onceq_failures",
            "Failures the ledger recorded (retried and dead), by reason.",
            labels=["flow", "reason"],
        )
        in_flight = GaugeMetricFamily(
            "onceq_in_flight", "Deliveries received and not yet settled.", labels=["flow"]
        )
        durations = HistogramMetricFamily(
            "onceq_effect_duration_seconds", "Duration of each effect call.", labels=["flow"]
        )
        b_open = GaugeMetricFamily(
            "onceq_breaker_open", "1 while the breaker is open or half-open.", labels=["flow"]
        )
        b_state = GaugeMetricFamily(
            "onceq_breaker_state",
            "1 for the breaker's current state.",
            labels=["flow", "state"],
        )
        queue = GaugeMetricFamily(
            "onceq_queue_messages",
            "Messages in the flow's queue, by state.",
            labels=["flow", "state"],
        )
        oldest = GaugeMetricFamily(
            "onceq_oldest_message_age_seconds",
            "Age of the oldest message waiting in inbox/ (0 when empty).",
            labels=["flow"],
        )
        # Dead letters alone by reason: onceq_failures_total also counts the attempts
        # that were retried, so it cannot say how many messages died of what.
        dead = CounterMetricFamily(
            "onceq_dead",
            "Messages dead-lettered, by the reason of their last failure.",
            labels=["flow", "reason"],
        )
        up = GaugeMetricFamily(
            "onceq_flow_up", "1 while the flow is healthy (the /healthz rule).", labels=["flow"]
        )
        for fm in self._flows():
            name = fm.name
            t = fm.total()
            for key, word in OUTCOMES.items():
                msgs.add_metric([name, word], getattr(t.stats, key))
            reasons: Counter[str] = Counter(t.stats.reasons)
            reasons.update(t.stats.requeued_reasons)
            for reason, n in sorted(reasons.items()):
                fails.add_metric([name, reason], n)
            in_flight.add_metric([name], t.in_flight)
            if t.durations is not None:
                durations.add_metric(
                    [name], buckets=t.durations.buckets(), sum_value=t.durations.sum
                )
            if t.breaker is not None:
                b_open.add_metric([name], 0 if t.breaker == CLOSED else 1)
                for st in BREAKER_STATES:
                    b_state.add_metric([name, st], 1 if st == t.breaker else 0)
            for reason, n in sorted(t.stats.reasons.items()):
                dead.add_metric([name, reason], n)
            up.add_metric([name], 1 if healthy(t.problem) else 0)
            if fm.queue is not None:
                for state, n in fm.queue.messages().items():
                    queue.add_metric([name, state], n)
                age = fm.queue.oldest_age()
                if age is not None:
                    oldest.add_metric([name], age)
        yield from (msgs, fails, dead, in_flight, durations, b_open, b_state, queue, oldest, up)


def new_registry(flows: Callable[[], Iterable[FlowMetrics]]) -> CollectorRegistry:
    """A registry of onceq's own: the flows' collector and the usual process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OnceqCollector(flows))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
