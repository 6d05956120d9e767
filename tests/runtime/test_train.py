"""Tests for labkit.train: the step, evaluation and fit's measurements."""

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
