"""tailguard: an event-sourced control plane for PySpark batch jobs."""

__version__ = "0.1.0"
