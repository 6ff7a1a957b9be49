"""The monitors' messages say what they carry, as types the app and the screens rely on."""

from __future__ import annotations

from typing import get_type_hints

from backends.gpu import GpuSnapshot
from tui.messages import GpusPolled


def test_a_gpu_poll_carries_a_snapshot():
    assert get_type_hints(GpusPolled.__init__)["snapshot"] is GpuSnapshot
