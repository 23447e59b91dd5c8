"""Stage `prepare`: load the dataset, give every sample its stable id, write features + manifest."""

from __future__ import annotations

from prefect import flow

from flows.common import base_parser, params_or_exit, prefect_api, use_project_path
from flows.errors import one_line_errors
from unlearning.config import load_params
from tasks.training import prepare_dataset
from tasks.reporting import run_logger


@flow(name="prepare")
def prepare(params_path: str = "params.yaml") -> dict:
    params = load_params(params_path)
    use_project_path(params)
    info = prepare_dataset(params)
    run_logger().info(f"prepared {info['name']}: {info['n_train']} train / {info['n_val']} val samples, "
          f"{len(info['class_names'])} classes -> {params.path('prepared_dir')}")
    return info


def main() -> None:
    """`python -m flows.prepare` (and `python -m flows.warm run flows.prepare` in a DVC stage)."""
    params_path = params_or_exit(base_parser(__doc__).parse_args().params)
    with one_line_errors(), prefect_api():  # bad data: one `error:` line, exit 2
        prepare(params_path)


if __name__ == "__main__":
    main()
