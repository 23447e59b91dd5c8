"""Which models hold tombstoned rows (unlearning/privacy/erasure.py): the rules by hand."""

from __future__ import annotations

from unlearning.privacy.erasure import clean_of_tombstones, state_is_clean, tombstones_digest


def test_a_checkpoint_is_clean_of_the_tombstones_it_records():
    t = {"a", "b"}
    assert clean_of_tombstones({}, set())                       # nothing erased
    assert not clean_of_tombstones({}, t)                       # no record: trained before them, or unknown
    assert clean_of_tombstones({"clean_of": tombstones_digest(t)}, t)
    assert clean_of_tombstones({"erased_through": tombstones_digest(t)}, t)
    assert not clean_of_tombstones({"clean_of": tombstones_digest({"a"})}, t)  # "b" erased after it was trained
    assert tombstones_digest({"a", "b"}) == tombstones_digest({"b", "a"})


def test_a_state_is_clean_when_its_ledger_accounts_for_the_tombstones_beyond_its_start():
    start = {"old1", "old2"}
    champion = {"started_clean_of": tombstones_digest(start)}
    assert state_is_clean(champion, set(), start)
    assert state_is_clean(champion, {"new"}, start | {"new"})        # a batch forgot and tombstoned "new"
    assert not state_is_clean(champion, set(), start | {"new"})      # tombstoned, never forgotten by this state
    # A state from before the record: clean only when every tombstone is its own ledger's
    assert state_is_clean({}, {"x"}, {"x"})
    assert not state_is_clean({}, set(), {"x"})                      # started (by an old reset) from a dirty original
    assert state_is_clean({"started_clean_of": tombstones_digest(set())}, set(), set())
