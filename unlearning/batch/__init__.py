"""One batch: its rows, their partition, its records and its summary (docs/design.md §1, §3, §4.4).

Reads the prepared store's manifest and the request's ids; decides the forget, retain, adjacent and validation rows
the batch evaluates, the frozen records the batch path passes (Selection, Promotion, BatchResult), the accuracy
changes it reports and the reviewer's summary.
"""
