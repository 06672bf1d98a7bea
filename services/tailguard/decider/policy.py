"""decider decision core (pure)."""
