"""Exercise checks: call one with your function (or your module's file), get a pass
or a specific hint.

Taught in: every lab's exercises. One module per lab, named after the lab's topic;
a lab imports its own: ``from labkit.checks import ddp as checks``. A check prints
"✅ ..." on success and raises ``ExerciseFailed`` (an AssertionError) saying what was
expected, what came back and which classic mistake explains it.

    environment     lab 00      pipeline          lab 05
    single_device   lab 01      communication     lab 06
    data_parallel   lab 02      sharding          lab 07
    ddp             lab 03      tensor_parallel   lab 08
    model_parallel  lab 04      fault_tolerance   lab 09

``_core`` holds what every check shares; ``_programs`` what the checks of program
exercises (``%%writefile`` modules launched on ranks) share; ``_watch`` runs a
learner's in-process code under a watchdog, with spies on forward and step (lab 02);
``_split`` what the model- and pipeline-parallel checks share (labs 04-05).
"""

from labkit.checks._core import ExerciseFailed

__all__ = ["ExerciseFailed"]
