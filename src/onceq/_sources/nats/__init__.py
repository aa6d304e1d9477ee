"""NATS JetStream as a source: a durable pull consumer with explicit acks (issue 21).

Everything about it lives in this package (its source type in
`onceq._sources.nats.plugin`); the generic layers reach it only through the registry.
"""
