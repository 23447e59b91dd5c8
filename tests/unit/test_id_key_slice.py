"""tasks/id_key.py IdKey: the slice a stage keys ids with keys them as the whole params do (unlearning/privacy/salt.py
id_salt), and building it reads and makes no key."""

from __future__ import annotations

from tasks.id_key import IdKey
from unlearning.config import parse_params
from unlearning.privacy.ledger import hash_sample_id
from unlearning.privacy.salt import id_salt


def test_the_slice_keys_ids_as_the_whole_params_do(tmp_path, monkeypatch):
    monkeypatch.delenv("UNLEARNING_ID_KEY", raising=False)
    params = parse_params({}, root=tmp_path)
    ids = IdKey.of(params)
    assert not params.path("salt").exists()  # building the record makes no key
    keys = ids.ledger_keys(["a", 7])
    assert params.path("salt").exists()  # keying an id does, as id_salt does
    salt = id_salt(params)
    assert ids.salt() == salt != "" and keys == [hash_sample_id("a", salt), hash_sample_id("7", salt)]
    assert keys[0] != "a"


def test_plain_ids_stay_as_they_are_and_no_key_is_made(tmp_path, monkeypatch):
    monkeypatch.delenv("UNLEARNING_ID_KEY", raising=False)
    params = parse_params({"deletion": {"hash_sample_ids": False}}, root=tmp_path)
    ids = IdKey.of(params)
    assert ids.ledger_keys(["a", 7]) == ["a", "7"] and ids.salt() == "" == id_salt(params)
    assert not params.path("salt").exists()
