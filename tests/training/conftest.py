"""Fixtures for the drafter math tests: random samples, a drafter with a random verifier
head, and a CPU allocation counter."""
from __future__ import annotations

import pytest
import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from training.config import PRESETS
from training.drafters.eagle3.model import Eagle3Drafter
from training.drafters.eagle3.vocab import build_draft_vocab


@pytest.fixture
def tiny_cfg():
    return PRESETS["tiny"]


@pytest.fixture
def make_sample(tiny_cfg):
    """make_sample(n, seed) -> a Sample of n tokens in float64, ~80 % of them loss-bearing."""
    H = tiny_cfg.hidden_size

    def make(n: int, seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        return dict(
            input_ids=torch.randint(0, tiny_cfg.vocab_size, (n,), generator=g),
            loss_mask=torch.rand(n, generator=g) > 0.2,
            aux_hidden=torch.randn(n, 3 * H, generator=g, dtype=torch.float64),
            final_hidden=torch.randn(n, H, generator=g, dtype=torch.float64))
    return make


@pytest.fixture
def drafter(tiny_cfg):
    """A float64 tiny drafter on a random verifier, draft vocab from random counts."""
    torch.manual_seed(0)
    model = Eagle3Drafter(tiny_cfg).double()
    V, H = tiny_cfg.vocab_size, tiny_cfg.hidden_size
    g = torch.Generator().manual_seed(1)
    d2t, t2d = build_draft_vocab(torch.randint(0, 50, (V,), generator=g),
                                 tiny_cfg.draft_vocab_size)
    model.load_verifier(torch.randn(V, H, generator=g, dtype=torch.float64),
                        torch.randn(V, H, generator=g, dtype=torch.float64) * 0.3, d2t, t2d)
    return model


@pytest.fixture
def peak_allocated_bytes():
    """peak_allocated_bytes(fn) -> the most bytes fn had allocated at once on the CPU,
    counted from the profiler's allocation events (allocations before fn are excluded)."""

    def measure(fn) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        events = []
        todo = list(prof.profiler.kineto_results.experimental_event_tree())
        while todo:
            node = todo.pop()
            todo.extend(node.children)
            if node.tag == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
        live = peak = 0
        for _, size in sorted(events):
            live += size
            peak = max(peak, live)
        return peak
    return measure


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    """The synthetic data set's cache, shared by the whole session."""
    path = tmp_path_factory.getbasetemp() / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(path))
    return path
