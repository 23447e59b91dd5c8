"""The tests' sample request files are the committed ones, whether or not `make run` already applied (moved and
hashed) the sample in this checkout: tests/helpers.py sample_requests."""

import subprocess

from tests.helpers import ROOT, sample_requests


def test_the_samples_are_the_committed_files_with_plain_ids():
    files = sample_requests()
    assert files, "the repository ships at least one sample request file in requests/inbox/"
    for f in files:
        committed = subprocess.run(["git", "show", f":requests/inbox/{f.name}"], cwd=ROOT, check=True,
                                   capture_output=True).stdout
        assert f.read_bytes() == committed
        assert b"sha256:" not in committed  # plain ids: a hashed processed copy would name no row
