"""The ensemble adapter on CUDA: a BatchNorm ResNet ensemble and the fused MLP path train on the GPU and
match the CPU run (float64, so only summation order differs), and a dropout module keeps per-member streams."""

import pytest
import torch

from unlearning.models import build_model, flat_params, train_ensemble

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

RESNET = {"arch": "resnet", "in_shape": [1, 8, 8], "n_classes": 3, "kwargs": {"widths": [4, 8], "blocks": 1}}
MLP = {"arch": "mlp", "in_shape": [64], "n_classes": 10, "kwargs": {"hidden": [32]}}


def data(d: int, n: int = 96, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    return X, ((X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()) % classes


@pytest.mark.parametrize("spec, kernel", [(RESNET, "autograd"), (MLP, "fused"), (MLP, "autograd")])
def test_cuda_training_matches_the_cpu(spec, kernel):
    X, y = data(64)
    cpu, gpu = build_model(spec, [1, 2, 3]).double(), build_model(spec, [1, 2, 3]).double().cuda()
    kw = {"epochs": 2, "batch_size": 16, "lr": 1e-2, "weight_decay": 1e-3, "kernel": kernel}
    train_ensemble(cpu, X, y, **kw)
    train_ensemble(gpu, X.cuda(), y.cuda(), **kw)
    assert torch.allclose(flat_params(gpu).cpu(), flat_params(cpu), atol=1e-8)
    for (name, a), (_, b) in zip(cpu.named_buffers(), gpu.named_buffers()):
        assert torch.allclose(a.double(), b.cpu().double(), atol=1e-8), name


def test_dropout_members_keep_their_own_streams_on_cuda():
    spec = {"arch": "custom", "factory": "tests.unit.custom_modules:bn_dropout_mlp", "in_shape": [64], "n_classes": 3}
    X, y = data(64)
    ens = build_model(spec, [4, 5], search_paths=["."]).cuda()
    alone = build_model(spec, [5], search_paths=["."]).cuda()
    for m in (ens, alone):
        train_ensemble(m, X.float().cuda(), y.cuda(), epochs=1, batch_size=16, lr=1e-2)
    assert torch.allclose(flat_params(ens)[1], flat_params(alone)[0], atol=1e-5)
