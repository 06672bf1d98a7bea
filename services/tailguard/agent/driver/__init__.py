"""The driver side: execution state, scheduling, the slot pool, command handling, fallbacks.

Nothing here touches Spark, Kafka or sockets directly: the adapters do.
"""
