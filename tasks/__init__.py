"""Prefect tasks: thin wrappers (load -> call the pure core -> save/log). Retries only on IO."""
