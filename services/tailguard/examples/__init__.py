"""Example jobs: the demo and the benchmarks run these; `tailguard run` runs them as files."""
