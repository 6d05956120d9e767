"""Lab 09, exercise 9.3, another idiom: a threading.Timer watchdog.

Instead of faulthandler's own countdown, a Python timer thread calls
faulthandler.dump_traceback(file, all_threads=True) when it fires; pet() replaces
the timer. (It works because the collective releases the GIL while it waits.)
"""
import faulthandler
import os
import threading
import time

import torch
import torch.distributed as dist


class Watchdog:
    def __init__(self, path, seconds):
        self.path, self.seconds, self.timer = path, seconds, None
        self.file = open(path, "w")
        self.pet()

    def _fire(self):
        faulthandler.dump_traceback(file=self.file, all_threads=True)
        self.file.flush()

    def pet(self):
        if self.timer is not None:
            self.timer.cancel()
        self.timer = threading.Timer(self.seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def close(self):
        if self.timer is not None:
            self.timer.cancel()
        self.file.close()


def steps(ctx, folder, num_steps, seconds, hang_at=None, step_s=0.05):
    watchdog = Watchdog(os.path.join(folder, f"rank{ctx.rank}.txt"), seconds)
    total = torch.ones(4)
    try:
        for step in range(num_steps):
            time.sleep(step_s)
            if step == hang_at and ctx.rank == 1:
                dist.broadcast(total, src=0)
            else:
                dist.all_reduce(total)
            watchdog.pet()
    except RuntimeError as err:
        return {"error": str(err).splitlines()[0]}
    finally:
        watchdog.close()
    return {"error": None}
