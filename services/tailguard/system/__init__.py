"""The system declared once: the table of the services (`services`), how each keeps its snapshot
(`retention`) and exports its core's counts (`core_metrics`, `service_metrics`). Pure: model and
the decision cores only; the shells, replay and the agent read it (docs/architecture.md)."""
