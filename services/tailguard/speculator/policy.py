"""speculator decision core (pure)."""
