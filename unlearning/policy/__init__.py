"""The policy: which methods a batch tries, in which order, and when the retraining debt forces an exact retrain
(docs/design.md §4.5).

Reads the batch's facts (gaps in noise units, cost against the budget, the objective), the rules of params.deletion
and the ledger's history; decides the Selection.
"""
