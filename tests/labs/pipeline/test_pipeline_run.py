"""Lab 05's schedules run for real (``pipeline_run``): in one process and on
threads, gradients equal the full batch's, the bubble follows the formula; and the
schedule explorer."""

import copy

import pytest
import torch
import torch.nn.functional as F

from labkit import models, pipeline, stages
from labkit.labs.pipeline import pipeline_run


def _problem():
    torch.manual_seed(0)
    model = models.deep_mlp(8, 32)
    inputs, targets = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    full = copy.deepcopy(model)
    loss = F.cross_entropy(full(inputs), targets)
    loss.backward()
    return model, inputs, targets, full, loss.item()


def _grad_gap(model, full) -> float:
    return max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.parameters(), full.parameters()))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 4), (4, 8)])
def test_in_order_gradients_equal_full_batch(name, p, m):
    """Does each schedule, run in one process, leave the full batch's gradients?"""
    model, inputs, targets, full, want = _problem()
    loss = pipeline_run.run_in_order(stages.split_stages(model, p), inputs,
                                     targets, m, name)
    assert loss == pytest.approx(want, rel=1e-5)
    assert _grad_gap(model, full) < 1e-6


@pytest.mark.parametrize("run", [pipeline_run.run_in_order,
                                 pipeline_run.run_on_threads])
def test_interleaved_gradients_equal_full_batch(run):
    """Does interleaved 1F1B (2 ranks x 2 chunks) leave the full batch's gradients?"""
    model, inputs, targets, full, want = _problem()
    cut = stages.split_stages(model, 4)
    result = run(cut, inputs, targets, 4, "interleaved_1f1b", num_chunks=2)
    loss = result if run is pipeline_run.run_in_order else result[0]
    assert loss == pytest.approx(want, rel=1e-5)
    assert _grad_gap(model, full) < 1e-6
    with pytest.raises(ValueError, match="do not split into 3 chunks"):
        run(cut, inputs, targets, 4, "interleaved_1f1b", num_chunks=3)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_threads_gradients_and_bubble(name):
    """On threads with a known stage cost: full-batch gradients, bubble near theory?

    Each action waits 100 ms: a loaded machine delays a thread by milliseconds, which
    a 10 ms cost turned into a 19-23 point gap (red in a fresh-clone run with two test
    workers of another run and a busy core beside it)."""
    model, inputs, targets, full, want = _problem()
    cut = stages.split_stages(model, 4)
    loss, events = pipeline_run.run_on_threads(cut, inputs, targets, 4, name, 0.1)
    assert loss == pytest.approx(want, rel=1e-5)
    assert _grad_gap(model, full) < 1e-6
    assert len(events) == 2 * 4 * 4
    assert abs(pipeline.bubble_fraction(events) - pipeline.bubble_theory(4, 4)) < 0.10


def test_thread_failure_names_the_rank():
    """Does an error inside a stage thread come back naming its rank?"""
    model, inputs, targets, _, _ = _problem()

    def broken_loss(out, y):
        raise ArithmeticError("boom")

    with pytest.raises(RuntimeError, match="pipeline rank 1 failed: ArithmeticError"):
        pipeline_run.run_on_threads(stages.split_stages(model, 2), inputs,
                                    targets, 2, "gpipe", 0.0, loss_fn=broken_loss)


def test_explorer_redraws_and_reports_bad_choices(capsys):
    """Does the widget build, redraw on change, and print invalid combinations?"""
    import matplotlib.pyplot as plt

    from labkit.labs.pipeline import explorer

    box = explorer.pipeline_schedules()
    name = box.children[0].children[0]
    micro = box.children[1].children[0]
    name.value, micro.value = "interleaved_1f1b", 6   # 6 is not a multiple of 4 stages
    printed = capsys.readouterr().out   # outside a kernel, Output() lets prints through
    assert "bubble: 15.8%" in printed and "multiple of num_stages (4)" in printed
    plt.close("all")


def test_thread_receive_times_out():
    """Does a stage waiting for a message that never comes give up, saying so?"""
    import queue

    with pytest.raises(TimeoutError, match="the pipeline is stuck"):
        pipeline_run._receive(queue.Queue(), [], timeout_s=0.1)
