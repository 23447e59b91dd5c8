"""Licensed inaction: whether a request may leave the model unchanged (docs/design.md §4.9; docs/certificate.md,
"Licensed inaction").

Reads the memorization map of the model version (IN versus OUT members on random halves) and the request's rows;
decides each row's score, the cut fitted on calibration rows, the class and cluster guards, and the licence.
"""
