"""verify-erasure's references: files that still name a forgotten id (plain ids: deletion.hash_sample_ids false),
counted per store."""

from tasks.erasure import id_references
from unlearning.config import parse_params


def test_files_naming_a_forgotten_id_are_counted_per_store(tmp_path):
    params = parse_params({}, root=tmp_path)
    art = tmp_path / "mlartifacts" / "1" / "run" / "artifacts"
    art.mkdir(parents=True)
    (art / "per_sample_klom.json").write_text('{"sample_id": ["digits-0145", "digits-0001"]}')
    (art / "partition.json").write_text('{"adjacent": ["digits-0002"]}')
    (art / "model.pt").write_bytes(b"digits-0145")  # not a text artifact: not searched
    processed = tmp_path / "requests" / "processed"
    processed.mkdir(parents=True)
    (processed / "a.csv").write_text("request_id,sample_id\nr1,digits-0145\n")
    found = id_references(params.project_paths, {"digits-0145", "C 0003"})
    refs = {r["store"]: r["files_naming_forgotten_ids"] for r in found}
    assert refs == {"MLflow artifacts": 1, "processed request files": 1}
    assert id_references(params.project_paths, set()) == []


def test_an_id_with_regex_characters_is_matched_literally(tmp_path):
    params = parse_params({}, root=tmp_path)
    (tmp_path / "requests" / "processed").mkdir(parents=True)
    (tmp_path / "requests" / "processed" / "a.csv").write_text("r1,a.b+c\n")
    (tmp_path / "requests" / "processed" / "b.csv").write_text("r1,axb+c\n")
    (ref,) = id_references(params.project_paths, {"a.b+c"})
    assert ref["files_naming_forgotten_ids"] == 1
