"""Exercise checks: call one with your function, get a pass or a specific hint.

Taught in: every lab's exercises. A check prints "✅ ..." on success and raises
``ExerciseFailed`` (an AssertionError) saying what was expected, what came back and
where to look. One module per lab topic; all checks are re-exported here.
"""

from labkit.checks._core import ExerciseFailed
from labkit.checks.environment import allreduce_time, count_parameters, training_memory
from labkit.checks.single_device import device_choice, minibatches, mnist_transform, train_step

__all__ = ["ExerciseFailed", "count_parameters", "training_memory", "allreduce_time",
           "device_choice", "mnist_transform", "minibatches", "train_step"]
