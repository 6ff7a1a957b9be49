"""The memory model's units: bytes of a GiB, of an activation, of an fp32, bf16 or index element."""
from __future__ import annotations

GiB = 1024**3
PRECISIONS = {"bf16": 2, "fp32": 4}  # bytes of an activation under autocast (fp32: none)
FP32 = 4
BF16 = 2
INDEX = 8  # int64 ids, positions, doc ids
