"""Peak memory of one EAGLE-3 training step, analytic and then calibrated on measured peaks.

The terms follow what its model.py, attention.py and loss.py keep for backward and
what training/loop.py allocates (fp32 weights under bf16 autocast, fused AdamW, DDP).
Every activation of every TTT step is still held when backward starts, so the peak of
the forward+backward comes in one of its first moments, whichever is the largest:
- ``loss_forward``: the last step's loss at work (the draft head cast, a chunk's logits,
  probabilities and gradient, every step's fp32 head gradient taken in forward);
- ``loss_backward``: its backward (the kept gradients scaled: the head's becomes .grad);
- ``norm_backward``: the last step's final norm backward: fp32 gradients of the whole
  row in the eager (fp32) trainer;
- ``attention_backward``: the last step's attention backward, where the keys and values
  of every step take gradients at once;
- ``fold_backward``: the last step's diagonal-key fold backward, where the diagonal keys
  and values take gradients beside the fold's stacked copies of them;
- ``fold_backward_pending``: with every step recomputed, the second-last step's fold
  backward, beside the last step's key and value gradients still to be used: the peak
  under --checkpoint-ttt (and, by more, with --offload-saved, which moves the kept terms
  and AdamW's state to a host side of the model, ``terms.host_terms``).
The optimizer step (weights, gradients and AdamW state; fused AdamW works in place) is a
phase of its own.

Every term belongs to one of four groups, by how it grows with the step's shape, T =
batch_rows × max_seq_len tokens and K TTT steps: ``constant``, ``per_token`` (∝ T),
``per_step`` (∝ T·K: what each step keeps) and ``diagonal`` (∝ T·K(K-1)/2: step k folds k
diagonal keys into its attention, keeping a weight per query head for each). A
``Calibration`` fits one scale per group from measured peaks (least squares on relative
error, the analytic scales as a weak prior, each measurement in the phase that peaks for
it), so a probe of a few small steps, or a finished run's metrics, corrects what the
analytic terms miss and the corrected model extrapolates in T and K.

One module per part: ``terms`` (the analytic bytes), ``state`` (the drafter's own
parameters), ``calibrate`` (the fitted scales), ``peak`` (the predicted peak), ``search``
(the largest step that fits), ``measured`` (a run's own peak, from its metrics); what
either drafter's model counts in, holds of its trained state and predicts is
training/memory/. None imports torch: the dashboard predicts an edit's memory on an
operator's laptop.

Predictions assume every position carries loss (the loss keeps per-position tensors), the
upper bound; hidden states are stored in the activation dtype, as extraction writes them.
"""
from __future__ import annotations

from training.drafters.eagle3.memory.calibrate import (
    MAX_FIT_ERROR,
    Calibration,
    Measurement,
    calibrate,
)
from training.drafters.eagle3.memory.measured import measurements_from_run, shape_from_start
from training.drafters.eagle3.memory.peak import CACHED_ROW_BLOCKS, predict
from training.drafters.eagle3.memory.search import fewest_checkpoint_ttt, largest_fitting
from training.drafters.eagle3.memory.state import parameter_counts
from training.drafters.eagle3.memory.terms import (
    GROUPS,
    PHASES,
    StepShape,
    analytic_phases,
    group_totals,
    host_terms,
    kept_per_token_checkpointed_step,
    saved_per_token_diag,
    saved_per_token_step,
)
from training.memory.peak import DEFAULT_HEADROOM_GIB, RESERVED_RATIO, Prediction, fits
from training.memory.state import SHARDINGS
from training.memory.units import PRECISIONS, GiB

__all__ = [
    "CACHED_ROW_BLOCKS", "DEFAULT_HEADROOM_GIB", "GROUPS", "MAX_FIT_ERROR", "PHASES",
    "PRECISIONS", "RESERVED_RATIO", "SHARDINGS", "Calibration", "GiB", "Measurement",
    "Prediction", "StepShape", "analytic_phases", "calibrate", "fewest_checkpoint_ttt",
    "fits", "group_totals", "host_terms", "kept_per_token_checkpointed_step", "largest_fitting",
    "measurements_from_run", "parameter_counts", "predict", "saved_per_token_diag",
    "saved_per_token_step", "shape_from_start",
]
