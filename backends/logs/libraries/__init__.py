"""The readers of lines a library prints in a shape of its own, one module each, tried on a
line in this order before the generic parsers (backends.logs.logparse): each says a line is its
(a count and its losses, or nothing to read) or not."""

from __future__ import annotations

from backends.logs.libraries.composer import ComposerLog
from backends.logs.libraries.litgpt import LitgptLog
from backends.logs.libraries.sb3 import Sb3Log
from backends.logs.libraries.sklearn import SklearnLog
from backends.logs.libraries.tables import Table
from backends.logs.libraries.timm import TimmLog
from backends.logs.libraries.torchtune import TorchtuneLog
from backends.logs.libraries.ultralytics import UltralyticsLog


def line_readers() -> tuple:
    """Fresh readers for one console (some keep what they saw: a header, an epoch)."""
    return UltralyticsLog(), Table(), TimmLog(), ComposerLog(), TorchtuneLog(), LitgptLog(), SklearnLog(), Sb3Log()
