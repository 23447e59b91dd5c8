"""Progress off a terminal: plain lines with elapsed time and ETA, at every 10 % or every 10 s."""

import io

import torch

from unlearning.progress import Progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_plain_lines_at_each_tenth_and_every_ten_seconds_with_an_eta():
    out, clock = io.StringIO(), Clock()
    with Progress(200, "oracles x80", unit="steps", stream=out, tty=False, clock=clock) as bar:
        for _ in range(200):
            clock.t += 0.25  # 50 s in all: the 10 % marks print (each 5 s after the last)
            bar.update()
    lines = out.getvalue().splitlines()
    assert lines[0] == "oracles x80: 0/200 steps (0%), 0.0 s elapsed"
    assert len(lines) == 11 and lines[-1].startswith("oracles x80: 200/200 steps (100%), 50.0 s elapsed")
    assert "ETA 25.0 s" in lines[5] and "\r" not in out.getvalue() and "\x1b" not in out.getvalue()

    out, clock = io.StringIO(), Clock()
    with Progress(200, "quick", stream=out, tty=False, clock=clock) as bar:
        for _ in range(200):
            clock.t += 0.005  # a 1 s loop: its start and its end only
            bar.update()
    assert len(out.getvalue().splitlines()) == 2

    out, clock = io.StringIO(), Clock()
    with Progress(1000, "slow", stream=out, tty=False, clock=clock) as bar:
        for _ in range(50):  # 5 % in 50 s: the time rule prints every 10 s
            clock.t += 1.0
            bar.update()
    assert len(out.getvalue().splitlines()) == 1 + 5 + 1  # start, 10 s ticks, end


def test_disabled_prints_nothing_and_training_reports_steps():
    from unlearning.models import build_model, train_ensemble

    out = io.StringIO()
    with Progress(5, "x", enabled=False, stream=out, tty=False) as bar:
        bar.update(5)
    assert out.getvalue() == ""
    model = build_model({"arch": "mlp", "in_dim": 3, "hidden": [4], "n_classes": 2}, [0])
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        train_ensemble(model, torch.randn(20, 3), torch.randint(0, 2, (20,)), epochs=2, batch_size=8, lr=0.01,
                       progress="train original")
    assert err.getvalue().splitlines()[-1].startswith("train original: 6/6 steps (100%)")


def _toy_context(progress):
    from unlearning.methods import TrainRecipe, UnlearnContext
    from unlearning.models import build_model, train_ensemble

    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 3
    X = torch.randn(3, 6, generator=g)[y] * 2 + torch.randn(60, 6, generator=g)
    model = build_model({"arch": "mlp", "in_dim": 6, "hidden": [8], "n_classes": 3}, [1, 2])
    train_ensemble(model, X, y, epochs=2, batch_size=16, lr=1e-2)
    adj = torch.zeros(50, dtype=torch.bool)
    adj[:15] = True
    return UnlearnContext(model, X[:10], y[:10], X[10:], y[10:], adj, TrainRecipe(epochs=2, batch_size=16, lr=1e-2),
                          seed=3, progress=progress)


def test_a_method_off_a_terminal_prints_plain_progress_lines():
    """Each unlearning candidate's loop reports like training does: plain lines (no \\r, no escape codes)
    with the method, the members, steps done of the phase's bound, and the elapsed time; quiet when off."""
    import contextlib

    from unlearning.methods import run_method

    for name, args, label in (("finetune", {"epochs": 3}, "finetune x2"),
                              ("newton_ggn", {"steps": 2, "gradient": "retain"}, "newton_ggn x2"),
                              ("scrub", {}, "scrub x2")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            run_method(name, _toy_context(True), args)
        text = err.getvalue()
        lines = text.splitlines()
        assert lines and all(line.startswith(label) for line in lines), (name, text)
        assert "\r" not in text and "\x1b" not in text
        assert lines[0].split(": ", 1)[1].startswith("0/") and "elapsed" in lines[-1], (name, text)
        assert "(100%)" in lines[-1] or "stopped early" in lines[-1], (name, text)
        if name == "newton_ggn":  # one unit per member and step, the member named as the stage
            assert lines[-1].startswith("newton_ggn x2 [member 2/2, exact]: 4/4 steps (100%)"), text
        if name == "scrub":  # one bar over every phase (not two lines per short phase), the phase as its stage
            assert len(lines) == 2 and lines[-1].startswith("scrub x2 [min"), text

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        run_method("finetune", _toy_context(False), {"epochs": 1})
    assert err.getvalue() == ""


def test_long_single_steps_keep_the_ten_second_lines_through_tick():
    """A loop whose one step takes long (a solver pass over every row): tick() from the inner loop prints
    the innermost bar's line, with its stage, once every_s passed; nothing without an active bar."""
    from unlearning.progress import tick

    out, clock = io.StringIO(), Clock()
    tick()  # no active bar: nothing happens
    with Progress(3, "leverage diagnostics", unit="stages", stream=out, tty=False, clock=clock) as bar:
        bar.stage("fit cg")
        for _ in range(35):  # 35 s inside one stage, ticked every second
            clock.t += 1.0
            tick()
        bar.update(3)
    lines = out.getvalue().splitlines()
    assert lines[1] == "leverage diagnostics [fit cg]: 0/3 stages (0%), 10.0 s elapsed" and len(lines) == 5


def test_leverage_diagnostics_report_their_stages():
    import contextlib

    from unlearning.leverage import compute_diagnostics

    ctx = _toy_context(False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        compute_diagnostics(ctx.model.select(0), ctx.X_forget, ctx.y_forget, ctx.X_retain, ctx.y_retain,
                            lam=1.0, solver="cg", progress=True)
    lines = err.getvalue().splitlines()
    total = int(lines[0].split("/")[1].split()[0])  # planned work units (rows x passes, Jacobian rows x C)
    assert lines[0] == f"leverage diagnostics: 0/{total} units (0%), 0.0 s elapsed" and total > 0
    assert lines[-1].startswith(f"leverage diagnostics [spectral norm]: {total}/{total} units (100%)")


def test_base_progress_false_silences_the_ensemble_chunks(capsys, tmp_path):
    """The oracle/shadow chunks follow base.progress: a line per chunk when on, nothing when off."""
    from tasks.training import train_ensemble_chunk
    from unlearning.methods import TrainRecipe

    spec = {"arch": "mlp", "in_dim": 3, "hidden": [4], "n_classes": 2}
    X, y = torch.randn(12, 3), torch.randint(0, 2, (12,))
    ids = [f"s{i}" for i in range(12)]
    for progress in (False, True):
        train_ensemble_chunk.fn(spec, X, y, ids, TrainRecipe(1, 4, 1e-2), [1, 2], None, "cpu", "oracles 3-4 of 4",
                                progress=progress)
        err = capsys.readouterr().err
        assert ("oracles 3-4 of 4: " in err) is progress, err


def test_chunks_that_run_side_by_side_say_which_members_they_train():
    """Two chunks of 32 both printed "oracles x32: 0/690 steps", which read as one line printed twice."""
    from tasks.references import chunk_labels

    assert chunk_labels("oracles", [32, 32, 16]) == ["oracles 1-32 of 80", "oracles 33-64 of 80", "oracles 65-80 of 80"]
    assert chunk_labels("shadows", [8]) == ["shadows x8"]


def test_after_s_keeps_a_quick_command_quiet_and_a_slow_one_visible():
    """`after_s`: a loop that ends within it prints nothing at all; a slower one starts its lines once it has run
    that long (the stage it is in named), keeps the 10 s rule, and ends with its last line."""
    out, clock = io.StringIO(), Clock()
    with Progress(4, "verify-erasure", unit="stores", stream=out, tty=False, clock=clock, after_s=2.0) as bar:
        for _ in range(4):
            clock.t += 0.4
            bar.update()
    assert out.getvalue() == ""
    with Progress(4, "verify-erasure", unit="stores", stream=out, tty=False, clock=clock, after_s=2.0) as bar:
        bar.stage("DVC cache")
        clock.t += 1.0
        bar.update()  # 1 s: still quiet
        clock.t += 24.0
        bar.poke()  # a tick past after_s shows the first line
        bar.update(3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "verify-erasure [DVC cache]: 1/4 stores (25%), 25.0 s elapsed, ETA 1 min 15 s"
    assert lines[-1].startswith("verify-erasure [DVC cache]: 4/4 stores (100%), 25.0 s elapsed") and len(lines) == 2


def test_a_heartbeat_keeps_the_ten_second_lines_where_nothing_ticks():
    """One long call that never ticks (loading a state, a library's own loop): the heartbeat thread pokes the bar,
    so a line comes every `every_s` all the same, naming the stage it is in."""
    import threading

    out, clock, printed = io.StringIO(), Clock(), threading.Event()

    class Stream(io.StringIO):
        def write(self, text):
            printed.set()
            return out.write(text)

    with Progress(2, "unlearn plan", unit="steps", stream=Stream(), tty=False, clock=clock, after_s=2.0,
                  heartbeat_s=0.01) as bar:
        bar.stage("loading the state")
        clock.t = 12.0  # the one call runs 12 s: the thread shows the first line without any update or tick
        assert printed.wait(5.0)
        bar.update(2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "unlearn plan [loading the state]: 0/2 steps (0%), 12.0 s elapsed"
    assert lines[-1].startswith("unlearn plan [loading the state]: 2/2 steps (100%)")
