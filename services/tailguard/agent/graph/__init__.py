"""The user-facing job-graph API and operator chaining (runs in the driver, before the job)."""
