"""blocklist decision core (pure)."""
