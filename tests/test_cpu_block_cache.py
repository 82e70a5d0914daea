"""trainer.cpu_block_cache_mb: freed large CPU blocks are reused instead of page-faulted in afresh, values and
gradients stay bit-identical, the limit holds. The allocator is process-wide, so each case runs in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest



_PROBE = textwrap.dedent("""
    import json, resource, sys
    import torch
    from sparse_runner.training import cpu_block_cache
    torch.set_num_threads(1)
    limit = int(sys.argv[1])
    state = cpu_block_cache.install(limit) if limit >= 0 else "off"
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def step(seed):  # an attention-like step: fresh 64 MiB scores and weights, forward and backward
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(64, 512, 16, generator=g, requires_grad=True)
        k = torch.randn(64, 16, 512, generator=g, requires_grad=True)
        w = torch.softmax(torch.bmm(q, k), -1)
        out = w.sum(-1).pow(2).sum() + (w * w).sum()
        out.backward()
        return out.item(), q.grad.sum().item(), k.grad.abs().sum().item()

    results = [step(s) for s in range(3)]
    start = faults()
    results += [step(s) for s in range(3, 6)]
    print(json.dumps({"state": state, "faults_per_step": (faults() - start) / 3, "results": results,
                      "stats": cpu_block_cache.stats()}))
""")
_PAGES_PER_TENSOR = 64 * 512 * 512 * 4 // 4096


def _probes(limits_mb: dict[str, int]) -> dict[str, dict]:
    """Each probe in its own process, all started at once: what they measure (page faults, values, the cache's
    counts) is each process' own, so they need not wait for one another."""
    procs = {name: subprocess.Popen([sys.executable, "-c", _PROBE, str(limit)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, limit in limits_mb.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def runs():
    return _probes({"off": -1, "cache": 2048, "tiny": 1})


def test_blocks_are_reused_without_page_faults(runs):
    cached = runs["cache"]
    if cached["state"].startswith("unavailable"):
        pytest.skip(cached["state"])
    assert cached["state"] == "installed (limit 2048 MiB)"
    # PyTorch's allocator alone faults every fresh 64 MiB tensor in (several per step); the cache none of them
    assert runs["off"]["faults_per_step"] > 2 * _PAGES_PER_TENSOR
    assert cached["faults_per_step"] < 0.05 * _PAGES_PER_TENSOR
    assert cached["stats"]["hits"] > cached["stats"]["misses"] > 0


def test_values_and_gradients_are_bit_identical(runs):
    assert runs["cache"]["results"] == runs["off"]["results"] == runs["tiny"]["results"]


def test_the_limit_holds(runs):
    tiny = runs["tiny"]
    if tiny["state"].startswith("unavailable"):
        pytest.skip(tiny["state"])
    assert tiny["stats"]["cached_bytes"] <= 2**20 and tiny["stats"]["hits"] == 0   # no 64 MiB block fits in 1 MiB
    assert tiny["faults_per_step"] > 2 * _PAGES_PER_TENSOR


def test_a_negative_limit_is_refused():
    from sparse_runner.training import cpu_block_cache

    with pytest.raises(ValueError, match="limit_mb must be >= 0, got -1"):
        cpu_block_cache.install(-1)


def test_without_a_compiler_the_run_keeps_pytorchs_allocator(monkeypatch, caplog):
    import torch.utils.cpp_extension

    from sparse_runner.training import cpu_block_cache

    def no_compiler(**_):
        raise RuntimeError("Error building extension\nc++: error: command not found")

    monkeypatch.setattr(cpu_block_cache, "_module", None)
    monkeypatch.setattr(cpu_block_cache, "_status", None)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    state = cpu_block_cache.install(2048)
    assert state.startswith("unavailable: RuntimeError") and "command not found" in state
    assert cpu_block_cache.stats() is None and "PyTorch's allocator stays" in caplog.text
    assert cpu_block_cache.install(2048) == state   # tried once per process
