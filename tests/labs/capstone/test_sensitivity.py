"""Lab 10's checks see attention's classic mistakes: each one moves what the checks
compare by at least 10 x their tolerance.

At GPT-2's initialisation (q and k drawn with std 0.02) attention is nearly uniform,
and a softmax scale off by sqrt(2) moved the numbers by about 1.4 x the tolerance:
a wrong program could pass. The checks' GPT draws q and k larger
(``GPTConfig.attention_std``); these tests hold every mistake far from the line, in
one process: the TP check's block output, and the 3-D check's weights after its
3 steps.
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from labkit.labs.capstone import checks, gpt, hints, reference

TOLERANCE = checks.TOLERANCE
MODEL = checks.CHECK.model
HEAD_DIM, WIDTH, TP = MODEL.width // MODEL.num_heads, MODEL.width, checks.CHECK.tp

# gpt.Attention's settings a mistaken program computes with
SETTINGS = {
    "scale off by sqrt(2): the rank's width C/tp in the scale": {"scale": (WIDTH // TP) ** -0.5},
    "scale of the whole width C": {"scale": WIDTH ** -0.5},
    "no causal mask": {"causal": False},
}


def _rank0_bias_on_every_rank(state: dict) -> dict:
    """q, k and v's biases as a program holds them that split the weights by heads
    but kept rank 0's block of each bias on every rank."""
    state = dict(state)
    for name in ("attn.q.bias", "attn.k.bias", "attn.v.bias"):
        block = state[name][:WIDTH // TP]
        state[name] = torch.cat([block] * TP)
    return state


def _block_gap(state, x, attention=None, wrong_state=None) -> float:
    right = hints.unsplit_block(state, checks.CHECK, x)["out"]
    wrong = hints.unsplit_block(wrong_state or state, checks.CHECK, x,
                                attention=attention)["out"]
    return (right - wrong).abs().max().item()


@pytest.mark.parametrize("mistake", list(SETTINGS) + ["heads split without their bias"])
def test_each_attention_mistake_misses_the_tp_check_by_10x(mistake):
    state, inputs = checks._tp_case()
    for x in inputs:
        if mistake in SETTINGS:
            gap = _block_gap(state, x, attention=SETTINGS[mistake])
        else:
            gap = _block_gap(state, x, wrong_state=_rank0_bias_on_every_rank(state))
        assert gap >= 10 * TOLERANCE, f"{mistake}: the block output moves by {gap:.2g}"


def _trained_gap(monkeypatch, model, attention: dict) -> float:
    """The largest weight difference after the 3-D check's 3 SGD steps between the
    right GPT and one whose every attention computes with ``attention``."""
    cfg = replace(checks.CHECK, model=model)
    batches = checks.check_batches()
    right = reference.train(cfg, batches)["weights"][-1]
    real = F.scaled_dot_product_attention

    def mistaken(q, k, v, is_causal=False, scale=None, **kwargs):
        return real(q, k, v, is_causal=attention.get("causal", is_causal),
                    scale=attention.get("scale", scale), **kwargs)

    monkeypatch.setattr(gpt.F, "scaled_dot_product_attention", mistaken)
    wrong = reference.train(cfg, batches)["weights"][-1]
    monkeypatch.undo()
    return max((right[name] - wrong[name]).abs().max().item() for name in right)


@pytest.mark.parametrize("mistake", SETTINGS)
def test_each_attention_mistake_misses_the_3d_check_by_10x(monkeypatch, mistake):
    gap = _trained_gap(monkeypatch, MODEL, SETTINGS[mistake])
    assert gap >= 10 * TOLERANCE, f"{mistake}: the weights move by {gap:.2g}"


def test_gpt2s_initialisation_would_hide_a_scale_off_by_sqrt2(monkeypatch):
    """Why the checks' GPT draws q and k larger: at GPT-2's 0.02 the scale mistake
    moves the trained weights by less than 10 x the tolerance."""
    gpt2_init = replace(MODEL, attention_std=0.02)
    mistake = "scale off by sqrt(2): the rank's width C/tp in the scale"
    assert _trained_gap(monkeypatch, gpt2_init, SETTINGS[mistake]) < 10 * TOLERANCE
