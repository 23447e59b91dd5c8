"""A run description longer than MLflow's tag limit keeps its first lines and points to the whole text."""

from adapters.tracking import Tracker


def test_a_long_description_is_cut_at_a_line_and_the_whole_text_logged(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e", tmp_path / "artifacts")
    run_id = tracker.start_run("r")
    text = "\n".join(f"| row {i} | {'x' * 40} |" for i in range(400))   # ~20,000 characters
    tracker.set_description(run_id, text, "full.md")
    short = "short description"
    other = tracker.start_run("s")
    tracker.set_description(other, short)
    note = tracker.client.get_run(run_id).data.tags["mlflow.note.content"]
    assert len(note) <= Tracker.DESCRIPTION_LIMIT and note.endswith("the whole text is the artifact `full.md`)")
    kept = note.split("\n\n... (cut here")[0]
    assert text.startswith(kept) and kept.endswith("|")          # cut at a line boundary
    path = tracker.client.download_artifacts(run_id, "full.md", str(tmp_path))
    assert open(path).read() == text
    assert tracker.client.get_run(other).data.tags["mlflow.note.content"] == short
    assert [a.path for a in tracker.client.list_artifacts(other)] == []
