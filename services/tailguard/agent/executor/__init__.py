"""What runs inside Spark executors: the slot runner loop, attempts, partitions, sources, sinks.

Imports nothing from the driver or the graph API (an import-linter contract keeps it so): an
executor receives plain specs, never the driver's state.
"""
