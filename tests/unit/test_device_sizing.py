"""How the batch finds its device's budget (tasks/planning.py): validation.gpu_memory_mb, else 90% of the free
device memory, with torch.cuda.mem_get_info injected (no GPU needed); a CPU keeps validation.memory_mb."""

import pytest

from tasks.planning import device_memory, workers_of
from unlearning.config import ConfigError, load_params

MB = 2**20


def params_with(**validation):
    from tests.helpers import ROOT

    return load_params(ROOT / "params.yaml", {"validation": validation})


def test_cuda_budget_is_the_key_or_the_free_memory_and_a_cpu_has_none():
    free = lambda: (10_000 * MB, 80_000 * MB)  # noqa: E731 (free, total) as torch.cuda.mem_get_info gives them
    mem = device_memory(params_with().validation, "cuda", 5 * MB, mem_get_info=free)
    assert mem.kind == "cuda" and mem.budget_bytes == 9_000 * MB and mem.member_bytes == 5 * MB
    assert "validation.gpu_memory_mb" in mem.key and "free device memory" in mem.key
    mem = device_memory(params_with(gpu_memory_mb=2048).validation, "cuda:0", mem_get_info=free)
    assert mem.budget_bytes == 2048 * MB and mem.key == "validation.gpu_memory_mb"
    assert device_memory(params_with().validation, "cpu", mem_get_info=free) is None


def test_chunks_share_one_cuda_device_and_spread_over_cpu_workers():
    p = params_with().validation
    assert workers_of(p, "cuda") == 1 and workers_of(p, "cpu") == 2
    assert workers_of(params_with(task_runner="dask", dask_workers=3).validation, "cuda") == 3


def test_gpu_memory_mb_is_validated_naming_the_key():
    with pytest.raises((ConfigError, ValueError), match="gpu_memory_mb"):
        params_with(gpu_memory_mb=1)
