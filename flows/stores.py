"""`python -m flows.stores [--params P]`: create the project's MLflow store once, at `make setup`.

A new SQLite store costs ~2.5 s (its tables, then MLflow's migrations to the installed version's head); made
here, the first `make run` does not pay it inside its train stage. Opens the store the pipeline uses (the
params' tracking URI and experiment; MLFLOW_TRACKING_URI wins), so an existing store is only checked. The
Prefect database is migrated by the Makefile (`prefect server database upgrade`), which also writes the
version stamp flows.session reads (prefect_db_is_migrated).
"""

from __future__ import annotations

from flows.common import base_parser, params_or_exit, tracker_for
from unlearning.config import load_params


def main() -> None:
    params = load_params(params_or_exit(base_parser(__doc__).parse_args().params))
    tracker = tracker_for(params)
    print(f"MLflow store ready: {params.mlflow_tracking_uri()} (experiment {params.tracking.experiment!r}, "
          f"id {tracker.experiment_id})")


if __name__ == "__main__":
    main()
