"""Broker operations: the embedded broker, its security, `tailguard broker` (docs/log.md)."""
