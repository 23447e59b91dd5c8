"""Pure core of the unlearning pipeline.

Models, data, leverage math, unlearning methods, metrics and policy. Depends only on torch, numpy,
pandas and pandera (scikit-learn is imported lazily to load the digits dataset). Orchestration
(prefect), tracking (mlflow), versioning (dvc) and great_expectations live in `tasks/` and `flows/`.
"""

__version__ = "0.1.0"
