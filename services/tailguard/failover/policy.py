"""failover decision core (pure)."""
