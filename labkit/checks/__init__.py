"""What every exercise check shares; each lab's checks are in its room.

Taught in: every lab's exercises. A lab imports its own checks from its room:
``from labkit.labs.ddp import checks`` (``labkit.labs`` lists the rooms). A check
prints "✅ ..." on success and raises ``ExerciseFailed`` (an AssertionError) saying
what was expected, what came back and which classic mistake explains it.

``_core`` holds what every check shares; ``_programs`` what the checks of program
exercises (``%%writefile`` modules launched on ranks) share; ``_watch`` runs a
learner's in-process code under a watchdog, with spies on forward and step (lab 02);
``_split`` what the model- and pipeline-parallel checks share (labs 04-05).
"""

from labkit.checks._core import ExerciseFailed

__all__ = ["ExerciseFailed"]
