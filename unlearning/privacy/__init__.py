"""Privacy: what of an erased id remains anywhere (docs/design.md §3; docs/erasure.md).

Reads the project's secret id key, the ledger, the tombstones and the stores' files; decides the keyed form of every
id (HMAC-SHA256), the ledger's entries, what an erase must purge and where it stands (its journal), and what a model
or a state was built from.
"""
