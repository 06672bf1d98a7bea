"""The team's tailguard jobs."""
