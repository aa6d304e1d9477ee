"""What a running consumer shows the outside: metrics, /healthz, the heartbeat,
telemetry's wiring, `onceq status`. Asks the source registry, never a source's type.
"""
