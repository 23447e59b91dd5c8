"""The certificate: whether a candidate model is as good as a retrain without the forgotten rows, and whether the batch
accepts it (docs/design.md §4.2, §4.5, §4.7).

Reads the logits of the candidate, the original and the reference models (oracles, shadow-unlearned models) on the
evaluated rows, and params.gate; decides each split's measures, the gate's verdict (each check statistical or
business) and the acceptance. The look loop is unlearning/sequential.py and the torch-free statistics
unlearning/stats.py, at the core's root.
"""
