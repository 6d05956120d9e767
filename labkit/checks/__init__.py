"""Exercise checks: call one with your function, get a pass or a specific hint.

Taught in: every lab's exercises. A check prints "✅ ..." on success and raises
``ExerciseFailed`` (an AssertionError) saying what was expected, what came back and
where to look. One module per lab topic; all checks are re-exported here.
"""

from labkit.checks._core import ExerciseFailed
from labkit.checks.data_parallel import (
    accumulation_steps,
    average_gradients,
    scaled_lr,
    scatter_batch,
    shard_indices,
    strip_module_prefix,
)
from labkit.checks.environment import allreduce_time, count_parameters, training_memory
from labkit.checks.pipeline import (
    bubble_formula,
    gpipe_step,
    gpipe_table,
    min_devices,
    overlap_seconds,
    split_in_two,
    split_microbatches,
)
from labkit.checks.single_device import (
    device_choice,
    minibatches,
    mnist_transform,
    train_step,
)

__all__ = [
    "ExerciseFailed",
    "count_parameters",
    "training_memory",
    "allreduce_time",
    "device_choice",
    "mnist_transform",
    "minibatches",
    "train_step",
    "min_devices",
    "split_in_two",
    "overlap_seconds",
    "bubble_formula",
    "split_microbatches",
    "gpipe_table",
    "gpipe_step",
    "scatter_batch",
    "average_gradients",
    "strip_module_prefix",
    "shard_indices",
    "scaled_lr",
    "accumulation_steps",
]
