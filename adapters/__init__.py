"""Adapters: the project's only doors to outside systems, with no Prefect in them (docs/design.md, "Layout").

MLflow (tracking.py, and champion_loader.py, which travels inside a registered model), the tracking store's
health check (store_check.py), DVC (dvc_ops.py, dvc_metrics.py), Great Expectations and the request checks
around it (request_check.py), Matplotlib figures (plots.py), the clock that splits a stage's time into
compute and tracking (clock.py) and whether a process runs (pids.py, standard library only: deploy/team.py imports
it too). They import the core (unlearning/) and nothing above it; the stages in tasks/
and the flows in flows/ call them.
"""
