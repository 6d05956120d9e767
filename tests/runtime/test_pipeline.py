"""Tests for labkit.pipeline and labkit.stages: schedule tables, the bubble formula,
micro-batches, the stage split every rank makes."""

import warnings

import pytest
import torch

from labkit import models, pipeline, stages, timeline
from labkit.labs.pipeline import pipeline_run

CASES = [("gpipe", p, m, 1) for p in (2, 3, 4) for m in (1, 2, 4, 8)] + \
        [("1f1b", p, m, 1) for p in (2, 3, 4) for m in (1, 2, 4, 8)] + \
        [("interleaved_1f1b", p, m, v) for p in (2, 4) for m in (4, 8) for v in (2, 3)]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_table_bubble_equals_formula(name, p, m, v):
    """Does every schedule table idle exactly (p-1)/(v*m+p-1) of its slots?"""
    table = pipeline.schedule(name, p, m, v)
    assert len(table) == p
    want = pipeline.bubble_theory(p, m, v)
    assert pipeline.bubble_fraction(table) == pytest.approx(want)
    done = [a for row in table for a in row if a is not None]
    assert len(done) == len(set(done)) == 2 * m * v * p


def test_theory_values():
    """Do the two bubble formulas give the textbook numbers?"""
    assert pipeline.bubble_theory(4, 8) == pytest.approx(3 / 11)
    assert pipeline.bubble_overhead(4, 8) == pytest.approx(3 / 8)
    assert pipeline.bubble_overhead(4, 8, 2) == pytest.approx(3 / 16)
    assert pipeline.bubble_theory(1, 5) == 0


def test_peak_activations_gpipe_m_1f1b_at_most_p():
    """Does GPipe hold m micro-batches per rank and 1F1B p - rank?"""
    assert pipeline.peak_activations(pipeline.schedule("gpipe", 4, 8)) == [8] * 4
    assert pipeline.peak_activations(pipeline.schedule("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert pipeline.peak_activations(pipeline.schedule("1f1b", 4, 2)) == [2, 2, 2, 1]


def test_text_grid_of_1f1b():
    """Does as_text print one line per step with F/B/. per rank?"""
    text = timeline.as_text(pipeline.schedule("1f1b", 2, 2))
    rows = [line.split() for line in text.splitlines()[1:]]
    assert rows == [["0", "F0", "."], ["1", "F1", "F0"], ["2", ".", "B0"],
                    ["3", "B0", "F1"], ["4", ".", "B1"], ["5", "B1", "."]]


def test_text_grid_names_stages_when_interleaved():
    """Does as_text prefix the stage when ranks hold several chunks?"""
    assert "2F0" in timeline.as_text(pipeline.schedule("interleaved_1f1b", 2, 2, 2))


@pytest.mark.parametrize("args, message", [
    (("zigzag", 2, 4), "choose one of gpipe, 1f1b, interleaved_1f1b"),
    (("gpipe", 0, 4), "num_stages must be a positive integer"),
    (("1f1b", 2, 2.0), "num_microbatches must be a positive integer"),
    (("gpipe", 2, True), "num_microbatches must be a positive integer"),
    (("gpipe", 2, 4, 2), "needs schedule 'interleaved_1f1b'"),
    (("interleaved_1f1b", 4, 6, 2), "multiple of num_stages"),
])
def test_bad_schedule_requests(args, message):
    """Do unknown names and bad counts fail with a message saying what to pass?"""
    with pytest.raises(ValueError, match=message):
        pipeline.schedule(*args)


def test_deadlocked_orders_are_reported():
    """Does an order that waits on itself raise instead of looping forever?"""
    orders = [[pipeline.Action("B", 0, 0), pipeline.Action("F", 0, 0)]]
    with pytest.raises(RuntimeError, match="deadlocks at step 0"):
        pipeline._simulate(orders, last_stage=0)


def test_batch_that_does_not_divide_is_an_error():
    """Is a batch that does not split into equal micro-batches a ValueError?"""
    with pytest.raises(ValueError, match=r"64 % 5 = 4"):
        pipeline.check_microbatches(64, 5, 1)
    with pytest.raises(ValueError, match=r"64 % 5 = 4"):   # even with m < p
        pipeline.check_microbatches(64, 5, 8)


def test_fewer_microbatches_than_stages_is_a_warning():
    """Is m < p legal, warned about with the numbers and the m >= 4p advice?"""
    with pytest.warns(UserWarning, match=r"2 micro-batch\(es\) for 4 stages: legal, "
                      r"but at least 2 stage\(s\) idle .* 60% .* >= 16 \(4 x stages\)"):
        assert pipeline.check_microbatches(64, 2, 4) == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # m >= p: no warning at all
        assert pipeline.check_microbatches(64, 8, 4) == 8
        assert pipeline.split_microbatches(torch.zeros(4, 2), torch.zeros(4), 1)


def test_split_microbatches_checks_lengths():
    """Do inputs and targets of different lengths fail before splitting?"""
    with pytest.raises(ValueError, match="inputs hold 4 samples but targets 3"):
        pipeline.split_microbatches(torch.zeros(4, 2), torch.zeros(3), 2)


def test_bubble_fraction_needs_events():
    """Does an empty timeline fail clearly?"""
    with pytest.raises(ValueError, match="at least one event"):
        pipeline.bubble_fraction([])


def test_split_stages_balances_weighted_layers():
    """Does split_stages give each stage the same number of Linear layers?"""
    cut = stages.split_stages(models.deep_mlp(8, 16), 4)
    assert [sum(isinstance(m, torch.nn.Linear) for m in s) for s in cut] == [2] * 4
    with pytest.raises(ValueError, match="use 1 to 8 stages"):
        stages.split_stages(models.deep_mlp(8, 16), 9)


def test_max_difference_names_mismatch():
    """Does comparing different parameter sets name what is missing?"""
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        models.max_difference({"a": torch.zeros(1), "b": torch.zeros(1)},
                          {"a": torch.zeros(1)})


def test_stages_split_the_same_model_as_the_reference():
    """Does every rank's stage hold exactly its slice of the reference model?"""
    cfg = stages.Config(num_layers=4, width=32, batch=16)
    whole = stages.whole_model(cfg)
    names = [dict(s.named_parameters())
             for s in stages.split_stages(stages.whole_model(cfg), 2)]
    assert set(names[0]) | set(names[1]) == {n for n, _ in whole.named_parameters()}
    assert set(stages.reference(cfg)["grads"]) == set(names[0]) | set(names[1])
    images, labels = stages.batch(cfg)
    assert images.shape == (16, 1, 28, 28) and labels.shape == (16,)
    assert stages.requests(cfg, 3).shape == (3, 1, 1, 28, 28)


def test_program_refuses_an_unknown_call():
    """Does a Program with an unknown calling convention fail, listing the valid ones?"""
    with pytest.raises(ValueError, match="one of batch, microbatches, order"):
        stages.Program("split_step", "train_step", call="waves")
