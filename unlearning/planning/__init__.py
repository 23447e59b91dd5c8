"""The plan: what a batch will train, cost and take before anything runs (docs/design.md §4.6).

Reads the candidates, the timing probe of the user's model (its cost curve, rounds and conditions),
params.validation and params.diagnostics, and the project's past batches; decides the steps, the models each trains,
the predicted seconds per phase with their range, and the memory.
"""
