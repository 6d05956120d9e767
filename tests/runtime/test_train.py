"""Tests for labkit.train: the step, evaluation and fit's measurements."""

import pytest
import torch

from labkit import data, models, train


def _toy_data(n=64):
    torch.manual_seed(0)
    images = torch.randn(n, 1, 28, 28)
    labels = (
        images.mean(dim=(1, 2, 3)) > 0
    ).long()  # learnable: sign of the mean pixel
    return data.DeviceData(images, labels)


def test_train_step_lowers_loss():
    """Does train_step return a float and reduce the loss on a fixed batch?"""
    source = _toy_data()
    model = models.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = [
        train.train_step(model, source.images, source.labels, opt) for _ in range(5)
    ]
    assert isinstance(losses[0], float) and losses[-1] < losses[0]


def test_evaluate_counts_correct_answers():
    """Does evaluate return the fraction of correct argmax predictions?"""

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return torch.stack([x[:, 0], -x[:, 0]], dim=1)

    batches = [
        (torch.tensor([[1.0], [-1.0], [2.0], [3.0]]), torch.tensor([0, 1, 1, 0]))
    ]
    assert train.evaluate(Fixed(), batches) == 0.75


def test_fit_measures_and_learns(capsys):
    """Does fit record losses, images, time and accuracy, and print one summary line?"""
    source = _toy_data()
    model = models.small_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = train.fit(
        model,
        lambda epoch: source.batches(16),
        lambda: source.batches(64),
        epochs=2,
        optimizer=opt,
        plot=False,
        max_steps=3,
    )
    assert len(history.losses) == 6 and history.images == 2 * 3 * 16
    assert history.seconds > 0 and history.images_per_second > 0
    assert len(history.accuracies) == 2
    assert "images/s on cpu, test accuracy" in capsys.readouterr().out


def test_live_plot_outside_notebook_is_silent():
    """Does LivePlot draw without a notebook and without raising?"""
    plot = train.LivePlot()
    plot.update(train.History(losses=[1.0, 0.5], accuracies=[0.5]))
    assert plot.handle is None and plot.ax_loss.lines


def test_images_per_second_leave_out_the_live_plot(monkeypatch):
    """Does a slow live plot leave fit's seconds (and so its images/s) untouched?

    A fake clock that only the plot moves (100 s per drawing): no verdict depends on
    how fast this machine trains."""
    import types

    clock = [0.0]

    class SlowPlot:
        def update(self, history):
            clock[0] += 100.0

    monkeypatch.setattr(train, "LivePlot", SlowPlot)
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    source = _toy_data(64)
    model = models.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    history = train.fit(model, lambda epoch: source.batches(16), lambda: [],
                        epochs=1, optimizer=opt, plot=True)
    assert clock[0] >= 100.0                # the plot was drawn (and "took" 100 s)
    assert history.seconds == 0.0           # none of it counted as training


def test_the_live_plot_redraws_at_most_every_few_seconds(monkeypatch):
    """On a busy machine a redraw costs seconds: does fit redraw during an epoch no
    more often than DRAW_EVERY_S of wall time (a fake clock: 4 s per step)?"""
    import types

    clock, drawn_at = [0.0], []

    class CountingPlot:
        def update(self, history):
            drawn_at.append(clock[0])

    def four_second_step(*args):
        clock[0] += 4.0
        return 0.0

    monkeypatch.setattr(train, "LivePlot", CountingPlot)
    monkeypatch.setattr(train, "train_step", four_second_step)
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    source = _toy_data(64)
    train.fit(models.small_cnn(), lambda epoch: source.batches(4), lambda: [],
              epochs=1, optimizer=None, plot=True)
    during = drawn_at[:-1]                  # the last one closes the epoch
    assert len(during) >= 2 and during[0] == 4.0
    assert all(b - a >= train.DRAW_EVERY_S for a, b in zip(during, during[1:]))


@pytest.fixture
def restore_threads(monkeypatch):
    """Give the test a clean environment and put torch's thread count back after it."""
    for name in (train.THREADS_ENV, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(before)


@pytest.mark.parametrize("load, want", [(0.0, 2), (0.4, 2), (1.2, 1), (12.0, 1)])
def test_use_free_cores_leaves_busy_cores_alone(restore_threads, capsys, load, want):
    """On 2 cores, does torch get the cores the load leaves free (at least one), and
    does the line say how many and why?"""
    monkeypatch = restore_threads
    monkeypatch.setattr(train.hardware, "cpu_count", lambda: 2)
    monkeypatch.setattr(train.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(train.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(train, "_TORCH_THREADS", 2)
    assert train.use_free_cores() is None
    assert torch.get_num_threads() == want
    out = capsys.readouterr().out
    assert f"CPU threads for this kernel: {want} of 2 core(s) (load {load:.1f}" in out


def test_use_free_cores_counts_only_this_process_share_of_the_load(restore_threads):
    """On a 16-CPU host whose quota gives this process 2, is the host's load scaled to
    those 2 (load 8 on 16 CPUs leaves one of the 2 free)?"""
    monkeypatch = restore_threads
    monkeypatch.setattr(train.hardware, "cpu_count", lambda: 2)
    monkeypatch.setattr(train.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(train.os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    monkeypatch.setattr(train, "_TORCH_THREADS", 2)
    train.use_free_cores()
    assert torch.get_num_threads() == 1


def test_use_free_cores_obeys_the_learner(restore_threads, capsys):
    """Does LABKIT_THREADS choose (and a bad value get a clear error), and does an
    OMP_NUM_THREADS that torch already read stay as it is?"""
    monkeypatch = restore_threads
    monkeypatch.setattr(train.os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    monkeypatch.setenv(train.THREADS_ENV, "2")
    train.use_free_cores()
    assert torch.get_num_threads() == 2 and "set by LABKIT_THREADS" in capsys.readouterr().out
    monkeypatch.setenv(train.THREADS_ENV, "two")
    with pytest.raises(ValueError, match="whole number of threads"):
        train.use_free_cores()
    monkeypatch.delenv(train.THREADS_ENV)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    train.use_free_cores()
    assert torch.get_num_threads() == 2 and "OMP_NUM_THREADS" in capsys.readouterr().out
