"""Adapters between the driver and the outside: Spark (runners, executors) and Kafka."""
