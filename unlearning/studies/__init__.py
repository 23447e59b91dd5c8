"""Evidence studies: the literature's central claims, measured with this library's own models,
methods, gate and diagnostics. Pure core (torch/numpy only); `flows/report.py` runs them, logs them to MLflow
and regenerates the results section of docs/evidence.md from their JSON (`unlearning.studies.readme`).

- S3 `random_sets`: "Ascent Fails to Forget" — random digits forget sets, methods and a GA/GDA sweep, judged
  by the calibrated retrain-equivalence gate against independent oracle retrains.
- S4 `entanglement`: "Machine Unlearning under Retain-Forget Entanglement" — Fashion-MNIST, forget = Shirt.
- S5 `diagnostics_study`: "Loss is Not Behavior" — leverage diagnostics before unlearning against the gap
  each method leaves, and the policy's first pick against the best method in hindsight.
"""
