"""Tests for labkit.timeline: recording real runs, tables as events, charts, overlap."""

import time

import matplotlib
import pytest
import torch

from labkit import pipeline, timeline

matplotlib.use("agg")


def test_recorder_stamps_wall_clock_on_cpu():
    """Does the CPU recorder time each block, in order, on its row?"""
    recorder = timeline.Recorder(row=3)
    with recorder.record("F", 0):
        time.sleep(0.01)
    with recorder.record("B", 0, row=5):
        pass
    forward, backward = recorder.events()
    assert (forward.row, forward.kind, forward.microbatch) == (3, "F", 0)
    assert forward.seconds >= 0.009 and backward.row == 5
    assert forward.end <= backward.start


def test_recorder_rejects_unknown_kind():
    """Does a kind other than F or B fail with the valid choices?"""
    with pytest.raises(ValueError, match="'F' \\(forward\\) or 'B' \\(backward\\)"):
        with timeline.Recorder().record("W", 0):
            pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_recorder_uses_cuda_events_on_gpu():
    """On a GPU, are events timed by CUDA events and converted to seconds?"""
    recorder = timeline.Recorder(0, "cuda")
    x = torch.randn(2048, 2048, device="cuda")
    with recorder.record("F", 0):
        for _ in range(10):
            x = x @ x / 2048
    (event,) = recorder.events()
    assert event.seconds > 0


def test_table_becomes_unit_step_events():
    """Does from_table place each action on its step, with the given lengths?"""
    table = pipeline.schedule("gpipe", 2, 2)
    events = timeline.from_table(table)
    assert len(events) == 8
    assert min(e.start for e in events) == 0 and max(e.end for e in events) == 6
    slow = timeline.from_table(table, forward=1.0, backward=2.0)
    assert max(e.end for e in slow) == 3 * 1.0 + 3 * 2.0
    want = pipeline.bubble_theory(2, 2)
    assert pipeline.bubble_fraction(events) == pytest.approx(want)


def test_draw_table_and_events():
    """Does draw give one labelled row per stage, for a table and for events?"""
    ax = timeline.draw(pipeline.schedule("1f1b", 3, 4), title="t")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["stage 0", "stage 1", "stage 2"]
    assert ax.get_xlabel() == "time step"
    events = [timeline.Event(0, "F", 0, 10.0, 10.001),
              timeline.Event(1, "B", 0, 10.002, 10.004)]
    ax = timeline.draw(events, row_label="rank")
    assert ax.get_xlabel() == "time (ms)" and ax.get_xlim()[1] == pytest.approx(4.0)
    matplotlib.pyplot.close("all")


def test_draw_and_text_reject_bad_input():
    """Do empty timelines and non-tables fail clearly?"""
    with pytest.raises(ValueError, match="no events"):
        timeline.draw([])
    with pytest.raises(ValueError, match="rank x step table"):
        timeline.as_text([timeline.Event(0, "F", 0, 0.0, 1.0)])


def test_busy_overlap():
    """Is overlap counted only while two or more rows are busy?"""
    def ev(row, start, end):
        return timeline.Event(row, "F", 0, start, end)

    assert timeline.busy_overlap([ev(0, 0, 1), ev(1, 1, 2)]) == 0
    assert timeline.busy_overlap([ev(0, 0, 2), ev(1, 1, 3)]) == 1
    assert timeline.busy_overlap([ev(0, 0, 4), ev(1, 1, 2), ev(2, 1.5, 3)]) == 2


def test_watch_records_order_spans_and_activations():
    """Does Watch see two forwards, backwards in reverse, and the activations held?"""
    from labkit import models

    stage = models.deep_mlp(4, 16)
    with timeline.Watch(stage, rank=1) as watch:
        outs = [stage(torch.randn(4, 1, 28, 28)) for _ in range(2)]
        held_at_peak = watch.peak_bytes
        for out in reversed(outs):
            out.sum().backward()
    assert watch.order == [("F", 0), ("F", 1), ("B", 1), ("B", 0)]
    assert [(e.row, e.kind, e.microbatch) for e in watch.events] == [
        (1, "F", 0), (1, "F", 1), (1, "B", 1), (1, "B", 0)]
    assert all(e.end >= e.start for e in watch.events)
    assert watch.peak_held == 2 and held_at_peak > 0
    assert watch._bytes == 0   # every saved activation was let go after its backward
    assert torch.autograd.backward.__name__ == "backward"   # restored on exit


def test_watch_counts_one_saved_tensor_once_and_skips_weights():
    """Are weights left out, and a tensor saved by two ops counted once?"""
    linear = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(2, 8, requires_grad=True)
    with timeline.Watch(torch.nn.Sequential(linear)) as watch:
        y = linear(x)        # saves x (and the weight: not counted)
        z = (x * x).sum()    # saves x twice more: the same tensor
    assert watch.peak_bytes == x.numel() * x.element_size()
    (y.sum() + z).backward()


def test_recorder_records_on_its_own_device(monkeypatch):
    """With a fake CUDA: events go on the recorder's device's stream, and events()
    synchronises that device (not the current one)."""
    seen = {"record": [], "sync": []}

    class FakeEvent:
        def __init__(self, enable_timing=False):
            self.at = 0.0

        def record(self, stream=None):
            seen["record"].append(stream)

        def elapsed_time(self, other):
            return 2.0   # ms

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda d=None: seen["sync"].append(d))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of {d}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    recorder = timeline.Recorder(1, "cuda:1")
    with recorder.record("F", 0):
        pass
    (event,) = recorder.events()
    assert seen["record"] == ["stream of cuda:1"] * 3
    assert seen["sync"] == [torch.device("cuda", 1)] * 2
    assert event.row == 1 and event.kind == "F"
