"""Would these point-to-point messages hang on NCCL? A model of how NCCL runs them.

Taught in: lab 05 (why ``run_order``'s sends leave in a ``dist.batch_isend_irecv``
with the next receive); lab 05's checks use it to name the hazard in a program that
passed on gloo, where a check cannot see it by running.

Two rules of NCCL, and the model is nothing more:

- a send is a GPU kernel that ends only when the matching receive runs on the other
  GPU (NCCL may finish a small send early into its buffers, but nothing promises
  it), and a receive ends when its send has run;
- both directions between two ranks share one communicator and one CUDA stream, so
  a rank's sends and receives towards one peer run in the order they were posted,
  each after the one before. A ``dist.batch_isend_irecv`` is one group: its sends
  and receives progress together.

Messages match by order, not by tag: the k-th send from rank a to rank b meets the
k-th receive on rank b from rank a. gloo has neither rule (its sends and receives
are independent transfers), which is why 1F1B with plain ``dist.isend`` passes on
gloo and can hang on NCCL: rank 0 posts [send a1][recv g0], rank 1 [send g0][recv a1],
and each send waits for a receive queued behind the other send. PyTorch's own
``Schedule1F1B`` batches its forward sends with the backward receives for this.

``first_hang(logs)`` replays every rank's messages under these rules: the logs are
``p2p.bounded``'s, one per rank (``op``, ``peer``, ``shape``, and ``batch``: which
``batch_isend_irecv`` call an entry belongs to, None for a lone call).
"""

from collections import Counter, deque

from labkit.messages import _

__all__ = ["first_hang", "describe"]

_SENDS = ("send", "isend")


def _groups(log: list) -> list[list]:
    """A rank's messages as posted: one list per batch; a lone message is its own."""
    groups, previous = [], None
    for entry in log:
        batch = entry.get("batch")
        if batch is None or batch != previous:
            groups.append([])
        groups[-1].append(entry)
        previous = batch
    return groups


def _partner(key: tuple) -> tuple:
    """The message that completes ``key`` = (rank, "send"/"recv", peer, k)."""
    rank, kind, peer, k = key
    return peer, "recv" if kind == "send" else "send", rank, k


class _Streams:
    """Every rank's groups, and per (rank, peer) the queue of groups still to run."""

    def __init__(self, logs: list):
        self.open: dict = {}      # (rank, group) -> keys of its unfinished messages
        self.home: dict = {}      # message key -> (rank, group)
        self.shape: dict = {}     # message key -> the tensor's shape
        self.queues: dict = {}    # (rank, peer) -> deque of groups, in posted order
        counted = Counter()
        for rank, log in enumerate(logs):
            for group, entries in enumerate(_groups(log)):
                keys = set()
                for entry in entries:
                    kind = "send" if entry["op"] in _SENDS else "recv"
                    peer = entry["peer"]
                    key = (rank, kind, peer, counted[rank, kind, peer])
                    counted[rank, kind, peer] += 1
                    keys.add(key)
                    self.home[key], self.shape[key] = (rank, group), entry.get("shape")
                    queue = self.queues.setdefault((rank, peer), deque())
                    if not queue or queue[-1] != group:
                        queue.append(group)
                self.open[rank, group] = keys

    def _at_head(self, key: tuple) -> bool:
        rank, _kind, peer, _k = key
        queue = self.queues.get((rank, peer))
        return bool(queue) and (rank, queue[0]) == self.home.get(key)

    def step(self) -> bool:
        """Run every message whose partner runs now; pop finished groups. Moved?"""
        moved = False
        for (rank, peer), queue in self.queues.items():
            if not queue:
                continue
            for key in list(self.open[rank, queue[0]]):
                partner = _partner(key)
                if key[2] == peer and self._at_head(key) and self._at_head(partner):
                    self.open[rank, queue[0]].discard(key)
                    self.open[self.home[partner]].discard(partner)
                    moved = True
        for (rank, _peer), queue in self.queues.items():
            while queue and not self.open[rank, queue[0]]:
                queue.popleft()
                moved = True
        return moved

    def stuck(self) -> list[dict]:
        """Each rank's first unfinished message at the head of its queues."""
        found = {}
        for (rank, peer), queue in sorted(self.queues.items()):
            waiting = sorted(k for k in self.open[rank, queue[0]] if k[2] == peer
                             ) if queue else []
            if waiting and rank not in found:   # (a group's other peer may be done)
                key = waiting[0]
                found[rank] = {"rank": rank, "op": key[1], "peer": peer,
                               "shape": self.shape[key],
                               "matched": _partner(key) in self.home}
        return list(found.values())


def first_hang(logs: list) -> list[dict] | None:
    """Replay each rank's messages as NCCL would run them; None if all complete.

    Otherwise one dict per stuck rank: ``rank``, ``op`` ("send" or "recv"), ``peer``,
    ``shape`` of the message it waits in, and ``matched`` (False: no rank ever posts
    its partner, a bug gloo reports too).
    """
    streams = _Streams(logs)
    while streams.step():
        pass
    stuck = streams.stuck()
    return stuck or None


def describe(stuck: list[dict]) -> str:
    """Say in one sentence where the ranks of ``first_hang`` would wait, and why."""
    waits = "; ".join(
        (_("rank {rank} in a send to rank {peer} of {shape}") if s["op"] == "send"
         else _("rank {rank} in a receive from rank {peer} of {shape}")).format(
             rank=s["rank"], peer=s["peer"], shape=tuple(s["shape"] or ()))
        for s in stuck)
    return _("On NCCL these messages would hang: {waits}. NCCL runs the sends and "
             "receives between two ranks in order on one stream, and a send ends only "
             "when its receive runs, so each waits for a message queued behind the "
             "other's. Post each send with the receive that the next step waits for "
             "in one dist.batch_isend_irecv (NCCL then runs them together), as "
             "run_order does.").format(waits=waits)
