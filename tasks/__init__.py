"""The stages: Prefect tasks and the work inside them (load -> call the pure core -> save, through adapters/).
Retries only on IO. Layout and layer order: docs/design.md, "Layout"."""
