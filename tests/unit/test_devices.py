"""`base.device: auto` picks CUDA wherever torch finds it (every stage resolves it through flows/common.py
device_of), and the certificate's evaluation runs where the batch computes, its rows moved there once."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from unlearning.batch.rows import BatchRows
from unlearning.devices import DeviceUnavailable, resolve_device
from unlearning.models import build_model

MLP = {"arch": "mlp", "in_shape": [4], "n_classes": 3, "kwargs": {"hidden": [5]}}


@pytest.mark.parametrize("available, want", [(True, "cuda"), (False, "cpu")])
def test_auto_is_cuda_when_torch_finds_it(monkeypatch, available, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert resolve_device("auto").type == want and resolve_device(None).type == want
    from flows.common import device_of
    from tests.helpers import ROOT
    from unlearning.config import load_params

    assert device_of(load_params(ROOT / "params.yaml")) == want  # base.device: auto, the default


def test_cuda_asked_for_without_one_names_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable, match="base.device = 'cuda'.*'auto' or 'cpu'"):
        resolve_device("cuda", "base.device")


def test_the_evaluation_moves_its_rows_to_the_device_once():
    from tasks.certify import Evaluator

    g = np.random.default_rng(0)
    prepared = SimpleNamespace(X=g.normal(size=(30, 4)).astype(np.float32), label=g.integers(0, 3, 30))
    rows = BatchRows(before=np.arange(20), forget=np.arange(3), retain=np.arange(3, 20),
                     adjacent_mask=np.zeros(17, bool), validation=np.arange(20, 30))
    ev = Evaluator(prepared, rows, None, "cpu")
    a = ev(build_model(MLP, [1, 2]))
    X = ev._X
    b = ev(build_model(MLP, [3]))
    assert ev._X is X and X.device.type == "cpu" and X.shape == (30, 4)  # the same tensor for every call
    assert a.shape == (2, 30, 3) and b.shape == (1, 30, 3)
    ref = build_model(MLP, [3])(torch.as_tensor(prepared.X[ev.eval_rows]))
    assert torch.allclose(b, ref.detach())
