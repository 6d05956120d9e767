"""What listens on the network during a launch: the tests that prove a job exposes
nothing beyond loopback share these (tests/runtime/test_crowding.py,
tests/labs/ddp/test_loopback.py)."""

import ipaddress
import os
import threading
import time

import psutil


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def listeners_below(pid: int) -> set:
    """(ip, port) of every listening TCP socket of ``pid``'s descendants."""
    below = {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.pid in below}


class ListenerWatch(threading.Thread):
    """Collect, every 0.1 s, the listening sockets of this process's descendants."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self.done = set(), threading.Event()

    def run(self):
        while not self.done.is_set():
            self.seen |= listeners_below(os.getpid())
            time.sleep(0.1)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join(5)
