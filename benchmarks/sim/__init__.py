"""A discrete-event simulator of a batch job on a large cluster, for comparing speculation
policies on the same seeded scenario (see `benchmarks/simulate.py`).

- `scenario`: the cluster and the job, drawn from stated distributions.
- `engine`: simulated time, slots, attempts, first-finisher-wins; calls a policy's hooks.
- `baselines`: no speculation, Spark's rule, LATE.
- `tailguard_driver`: tailguard's real detector, speculator and blocklist cores, fed the events
  the agent would publish, their commands applied as the agent would.
- `report`: the comparison table and its JSON form.
"""
