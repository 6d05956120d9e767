"""Lab 08: correct solutions written in other idioms pass their checks.

Each module in tests/alternatives/lab08_*.py is a whole solution of one program
exercise, written the way another source writes it (Megatron-LM's mappings, PyTorch's
TP tutorial, the DeviceMesh docs). The checks judge what a solution computes, so each
must pass, next to test_lab08_tensor_parallel.py's mistakes, which must still fail.
"""

import shutil
from pathlib import Path

import pytest

from labkit.labs.tensor_parallel import checks

ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"

CASES = [
    ("lab08_tp_mlp_megatron.py", "tp_mlp.py", checks.tp_mlp),
    ("lab08_tp_block_tutorial.py", "tp_block.py", checks.tp_block),
    ("lab08_tp_block_nested.py", "tp_block.py", checks.tp_block),
    ("lab08_dp_tp_strided.py", "dp_tp.py", checks.dp_tp),
]


@pytest.mark.parametrize("alternative, module, check", CASES,
                         ids=[case[0] for case in CASES])
def test_alternative_solution_passes(tmp_path, monkeypatch, capsys, alternative,
                                     module, check):
    """Does a correct solution in another idiom pass the exercise's check?"""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ALTERNATIVES / alternative, tmp_path / module)
    check(str(tmp_path / module))
    assert "✅" in capsys.readouterr().out


def test_request_seconds_in_another_order_passes(capsys):
    """Does a latency model that sums the same terms in another order pass?"""
    from labkit.labs.tensor_parallel import latency_model as lm

    def request_seconds(layers, device, link, n, split):
        if n == 1 or split == "single":
            return sum(lm.layer_seconds(layers, device, 1)
                       for _ in range(layers.num_layers))
        message = link.message_seconds(layers.activation_bytes)
        if split == "layerwise":
            return (layers.num_layers * lm.layer_seconds(layers, device, 1)
                    + (n - 1) * message + message)
        per_layer = lm.layer_seconds(layers, device, n) + sum(
            link.allreduce_seconds(layers.activation_bytes, n)
            for _ in range(layers.allreduces))
        return message + per_layer * layers.num_layers

    checks.request_seconds(request_seconds)
    assert "✅" in capsys.readouterr().out
