"""The consume loop and what it needs, knowing no transport, ledger backend or effect:
the message spec, outcomes and the settle decision, the transport protocol, retry
policy, breaker, holds, the in-flight guard, stop, stats, the misconfiguration guard,
log events, redaction, configuration keys. The lowest layer: it imports no other.
"""
