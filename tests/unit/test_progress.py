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
