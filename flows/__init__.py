"""Prefect flows: prepare, train, deletion_batch, audit, serve. Importing this package sets the offline
switches (STACK_NOTES) unless the environment already chose otherwise."""

import os

for _key, _value in {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "GIT_PYTHON_REFRESH": "quiet",
}.items():
    os.environ.setdefault(_key, _value)
