"""Train and evaluate on one device: a step, an epoch loop with throughput, a live plot.

Taught in: lab 01 (the single-device baseline every later lab is measured against).
The loop is the plain one from the article; labs show it in full before using ``fit``.
"""

import io
import os
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm as _auto_tqdm
from tqdm.std import tqdm as _text_tqdm

from labkit import hardware
from labkit.messages import _

__all__ = ["train_step", "evaluate", "History", "fit", "LivePlot", "synchronize",
           "use_free_cores"]

THREADS_ENV = "LABKIT_THREADS"
_TORCH_THREADS = torch.get_num_threads()   # torch's own choice, before anyone changes it
# The live plot redraws at most this often: on a busy machine one redraw takes a second
# or more of wall time (it is not counted as training, but the learner waits for it).
DRAW_EVERY_S = 10.0


def train_step(model, images, labels, optimizer, autocast: bool = False) -> float:
    """Run one optimisation step and return the loss before the update."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(model, batches) -> float:
    """Return the accuracy (0..1) of ``model`` over an iterable of (images, labels)."""
    model.eval()
    correct = total = 0
    for images, labels in batches:
        correct += (model(images).argmax(dim=1) == labels).sum().item()
        total += len(labels)
    model.train()
    return correct / max(total, 1)


def synchronize(device) -> None:
    """Wait for queued GPU work, so wall-clock timings are honest; no-op on CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _load(cores: int) -> float:
    """Runnable processes competing for this process's ``cores`` (1-minute average).

    The machine's load, scaled to the share of its CPUs this process may use (a
    container's quota, taskset); 0 where the platform has no load average.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 0.0
    return load * cores / max(cores, os.cpu_count() or cores)


def use_free_cores() -> None:
    """Give torch's CPU threads the cores that are free now (at least one); say why.

    torch splits each CPU operation over its intra-op threads (one per core by
    default), and the operation ends when the last thread does. On a machine shared
    with other work a thread that waits for its core holds every other thread up, so
    more threads than free cores make each step slower, not faster. ``LABKIT_THREADS``
    (or ``OMP_NUM_THREADS``, which torch reads itself) chooses instead. Never more
    than torch's own default; it returns nothing, so a cell prints only its line.
    """
    cores = hardware.cpu_count()
    if os.environ.get(THREADS_ENV, "").strip():
        threads, why = _threads_from_env(), _("set by {env}").format(env=THREADS_ENV)
    elif os.environ.get("OMP_NUM_THREADS", "").strip():
        threads, why = torch.get_num_threads(), _("set by OMP_NUM_THREADS")
    else:
        load = _load(cores)
        threads = max(1, min(_TORCH_THREADS, round(cores - load)))
        why = _("load {load:.1f}: the cores that are free now; "
                "{env}=N chooses").format(load=load, env=THREADS_ENV)
    torch.set_num_threads(threads)
    print(_("CPU threads for this kernel: {threads} of {cores} core(s) ({why}).").format(
        threads=threads, cores=cores, why=why))


def _threads_from_env() -> int:
    text = os.environ[THREADS_ENV].strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(_("{env} must be a whole number of threads, at least 1; got "
                           "{text!r}.").format(env=THREADS_ENV, text=text))
    return int(text)


@dataclass
class History:
    """What ``fit`` measured: per-step losses, per-epoch accuracy, time and images/s."""

    losses: list = field(default_factory=list)
    accuracies: list = field(default_factory=list)
    images: int = 0
    seconds: float = 0.0  # training only: evaluation is excluded

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0


def fit(
    model,
    make_batches,
    test_batches,
    epochs: int,
    optimizer,
    scheduler=None,
    device="cpu",
    autocast: bool = False,
    plot: bool = True,
    max_steps: int | None = None,
) -> History:
    """Train for ``epochs`` and evaluate after each; show a bar and a live plot.

    ``make_batches(epoch)`` returns that epoch's (images, labels) on ``device``
    (``DeviceData.batches`` or a DataLoader); ``test_batches()`` likewise for testing.
    ``max_steps`` stops each epoch early (quick mode, fair side-by-side timings).
    Images/s count training only: evaluation and drawing the live plot are excluded,
    so a run with ``plot=True`` compares fairly with one without.
    """
    device = hardware.as_device(device)
    history, live = History(), LivePlot() if plot else None
    drawn = float("-inf")   # when the live plot was last drawn
    model.train()
    for epoch in range(epochs):
        synchronize(device)
        start, drawing = time.perf_counter(), 0.0
        bar = _progress(make_batches(epoch), max_steps,
                        _("epoch {epoch}/{epochs}").format(epoch=epoch + 1,
                                                           epochs=epochs))
        for step, (images, labels) in enumerate(bar):
            if max_steps is not None and step >= max_steps:
                break
            images, labels = images.to(device, non_blocking=True), labels.to(device)
            loss = train_step(model, images, labels, optimizer, autocast)
            history.losses.append(loss)
            history.images += len(labels)
            if scheduler is not None:
                scheduler.step()
            if live and time.perf_counter() - drawn >= DRAW_EVERY_S:
                drawing += _timed(live.update, history)   # the plot is not training
                drawn = time.perf_counter()
        bar.close()
        synchronize(device)
        history.seconds += time.perf_counter() - start - drawing
        history.accuracies.append(evaluate(model, test_batches()))
        if live:
            live.update(history)
    print(
        _("{epochs} epoch(s), {images} images in {seconds:.1f} s: "
          "{images_per_second:,.0f} images/s on {device}, "
          "test accuracy {accuracy:.2%}").format(
              epochs=epochs, images=history.images, seconds=history.seconds,
              images_per_second=history.images_per_second, device=device,
              accuracy=history.accuracies[-1])
    )
    return history


def _timed(fn, *args) -> float:
    """Call ``fn(*args)``; return the seconds it took."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def _progress(batches, max_steps: int | None, desc: str):
    """Wrap ``batches`` in a tqdm bar whose total is known when it can be."""
    total = len(batches) if hasattr(batches, "__len__") else None
    if max_steps is not None:
        total = min(total, max_steps) if total else max_steps
    # A static page (the course book) has no kernel for a widget: a text bar there.
    bar = _text_tqdm if os.environ.get("LABKIT_STATIC") == "1" else _auto_tqdm
    return bar(batches, desc=desc, leave=False, total=total)


class LivePlot:
    """Loss and accuracy curves that redraw in place in a notebook (only there)."""

    def __init__(self):
        import matplotlib.pyplot as plt

        from labkit.timeline import use_cjk_font

        use_cjk_font()
        self.fig, (self.ax_loss, self.ax_acc) = plt.subplots(1, 2, figsize=(9, 3))
        plt.close(self.fig)  # shown through the display handle only, not twice
        self.handle = None

    def update(self, history: History) -> None:
        """Redraw both panels from ``history``."""
        from IPython import get_ipython
        from IPython.display import Image, display

        self.ax_loss.clear()
        self.ax_loss.plot(history.losses, lw=0.8)
        self.ax_loss.set(xlabel=_("step"), ylabel=_("training loss"), yscale="log")
        self.ax_acc.clear()
        self.ax_acc.plot(
            range(1, len(history.accuracies) + 1), history.accuracies, "o-"
        )
        self.ax_acc.set(xlabel=_("epoch"), ylabel=_("test accuracy"))
        self.ax_acc.xaxis.get_major_locator().set_params(integer=True)
        self.fig.tight_layout()
        if get_ipython() is None:
            return
        # A PNG rendered here shows whatever matplotlib backend the kernel runs.
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png", bbox_inches="tight")
        image = Image(data=buffer.getvalue(), format="png")
        if self.handle is None:
            self.handle = display(image, display_id=True)
        else:
            self.handle.update(image)
