"""Lab 02's function check (the ``module.`` prefix): the hint for each classic
mistake. Its program checks are tested in test_programs.py."""

import pytest

from labkit import checks
from labkit.labs.data_parallel import checks as data_parallel


def _fails(check, fn, hint):
    with pytest.raises(checks.ExerciseFailed, match=hint):
        check(fn)


def test_strip_module_prefix_hints():
    """Is str.replace (which also renames a layer called 'module') caught?"""
    _fails(
        data_parallel.strip_module_prefix,
        lambda sd: {k.replace("module.", ""): v for k, v in sd.items()},
        "LEADING",
    )
    _fails(
        data_parallel.strip_module_prefix,
        lambda sd: {k.removeprefix("module."): v * 0 for k, v in sd.items()},
        "keep every tensor",
    )


def _stub(*args):
    raise NotImplementedError()


def test_stub_is_not_done_yet():
    """Does the check call the untouched stub 'not done yet'?"""
    _fails(data_parallel.strip_module_prefix, _stub, "not done yet")
