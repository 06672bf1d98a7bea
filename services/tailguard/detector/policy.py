"""detector decision core (pure)."""
