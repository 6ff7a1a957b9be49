"""The readers of lines a library prints in a shape of its own, one module each, tried on a
line in this order before the generic parsers (backends.logparse): each says a line is its
(a count and its losses, or nothing to read) or not."""

from __future__ import annotations

from backends.composer_log import ComposerLog
from backends.litgpt_log import LitgptLog
from backends.sb3_log import Sb3Log
from backends.sklearn_log import SklearnLog
from backends.tables import Table
from backends.timm_log import TimmLog
from backends.torchtune_log import TorchtuneLog
from backends.ultralytics_log import UltralyticsLog


def line_readers() -> tuple:
    """Fresh readers for one console (some keep what they saw: a header, an epoch)."""
    return UltralyticsLog(), Table(), TimmLog(), ComposerLog(), TorchtuneLog(), LitgptLog(), SklearnLog(), Sb3Log()
