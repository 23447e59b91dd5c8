"""Shared by the digits benches: the digits default problem lives in the core (unlearning.studies.digits)."""

from unlearning.studies.digits import DigitsProblem, digits_problem, train_members  # noqa: F401
