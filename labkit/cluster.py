"""A cluster in a box: 2-4 "nodes" on one machine, each a Linux network namespace with
its own address, host name and network stack, joined by a shaped link.

Taught in: labs 03 (the two-node ``torchrun`` command, for real), 06 (a real slow
link next to the ``sleep`` emulation) and 09 (a node that fails and comes back);
``env/cluster/cluster.py`` is its command line and ``env/cluster/README.md`` its guide.

Needs root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``: in a container, ``--cap-add
NET_ADMIN --cap-add SYS_ADMIN``), ``ip`` and ``tc`` (iproute2) and ``unshare``
(util-linux). ``unavailable()`` says why not, in one line, everywhere else.

What ``Cluster(nodes=2, profile="1gbe")`` builds, all of it inside namespaces it
creates (the host's own network gets no address, interface, route or qdisc):

- a switch: namespace ``NAME-sw`` holding a bridge ``br0``;
- node i: namespace ``NAME-node<i>`` with ``lo`` and ``eth0`` (a veth pair whose
  other end is a port of the bridge), address ``10.77.0.<i+1>/24``, host name
  ``node<i>`` (each command runs in a UTS namespace of its own with that name) and
  an ``/etc/hosts`` naming every node (``ip netns exec`` mounts
  ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts`` for the command);
- the link: each node's ``eth0`` sends through ``tbf`` at the profile's rate and,
  where the kernel has ``netem``, a one-way delay (so a round trip adds twice it).
  No route leads anywhere else: the nodes reach each other and nothing more.

``NAME`` is ``lkc<pid>-<n>``: two clusters, even in one process, never share a
name, and inside each the addresses and ports are private, so two runs never
collide. Teardown (``down``: every process in the namespaces killed, the
namespaces deleted, ``/etc/netns/<namespace>`` removed) runs on exit, on an
exception, on Ctrl-C and on SIGTERM; ``python -m labkit.cluster down --stale``
removes what a SIGKILLed run left behind.
"""

import argparse
import atexit
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from labkit.messages import _   # unavailable()'s reasons reach the notebooks

__all__ = ["Link", "PROFILES", "link", "parse_rate", "parse_delay", "unavailable",
           "has_netem", "Cluster", "ClusterError", "existing", "leftovers",
           "remove", "main"]

PREFIX = "lkc"                     # every namespace this module creates starts so
SUBNET = "10.77.0"                 # 10.77.0.0/24, private to each cluster's nodes
IFNAME = "eth0"                    # each node's interface (GLOO_SOCKET_IFNAME)
BURST = 256 * 1024                 # tbf's smallest bucket (see _shape)
MASTER_PORT = 29500                # free in every cluster: the namespaces are new
NETNS_ETC = Path("/etc/netns")
_NAME = re.compile(rf"^({PREFIX}(\d+)-\d+)-(node\d+|sw)$")
_SET_HOSTNAME = 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"'
_counter = iter(range(1, 10**9))


class ClusterError(RuntimeError):
    """A cluster could not be built, or a command in it failed."""


# ---------------------------------------------------------------- links

@dataclass(frozen=True)
class Link:
    """A link between the nodes: ``rate_bits`` per direction, ``delay_s`` one way.

    ``rate_bits=None`` leaves the rate alone (veth: as fast as the CPUs copy);
    the delay is added on each node's egress, so a round trip adds ``2 * delay_s``.
    """

    name: str
    rate_bits: float | None
    delay_s: float = 0.0

    @property
    def bytes_per_s(self) -> float | None:
        """The rate in bytes per second (None: not shaped)."""
        return None if self.rate_bits is None else self.rate_bits / 8

    def describe(self) -> str:
        rate = (_("rate not shaped") if self.rate_bits is None
                else f"{_rate_text(self.rate_bits)} ({self.bytes_per_s / 1e9:g} GB/s)")
        return _("{name}: {rate}, {delay_us:g} us one way").format(
            name=self.name, rate=rate, delay_us=self.delay_s * 1e6)


# A 1 GbE data-centre hop has a round trip of about 100 us through the kernels;
# faster Ethernet lowers it; InfiniBand-like fabrics are a few microseconds.
PROFILES = {
    "1gbe": Link("1gbe", 1e9, 50e-6),
    "10gbe": Link("10gbe", 10e9, 20e-6),
    "25gbe": Link("25gbe", 25e9, 10e-6),
    "lowlat": Link("lowlat", 100e9, 2e-6),
    "none": Link("none", None, 0.0),
}

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_DELAY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_rate(text) -> float:
    """Return bits/s from ``"1gbit"``, ``"250mbit"``, ... (tc's units) or a number."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9.]+)\s*([a-z]+)\s*", str(text).lower())
        if not match or match.group(2) not in _RATE_UNITS:
            raise ValueError(f"rate {text!r}: write a number and one of "
                             f"{', '.join(_RATE_UNITS)} (e.g. 1gbit, 250mbit).")
        value = float(match.group(1)) * _RATE_UNITS[match.group(2)]
    if value <= 0:
        raise ValueError(f"rate must be positive, got {text!r}.")
    return value


def parse_delay(text) -> float:
    """Return seconds from ``"50us"``, ``"2ms"``, ``"0.1s"`` or a number (seconds)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9.]+)\s*(s|ms|us)\s*", str(text).lower())
        if not match:
            raise ValueError(f"delay {text!r}: write a number and s, ms or us "
                             "(e.g. 50us, 2ms).")
        value = float(match.group(1)) * _DELAY_UNITS[match.group(2)]
    if value < 0:
        raise ValueError(f"delay cannot be negative, got {text!r}.")
    return value


def _rate_text(bits: float) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits >= _RATE_UNITS[unit]:
            return f"{bits / _RATE_UNITS[unit]:g} {unit[0].upper()}bit/s"
    return f"{bits:g} bit/s"


def link(profile="1gbe", rate=None, delay=None) -> Link:
    """Return a profile's ``Link``, with ``rate``/``delay`` overriding its values."""
    if isinstance(profile, Link):
        chosen = profile
    elif profile in PROFILES:
        chosen = PROFILES[profile]
    else:
        raise ValueError(f"Unknown link profile {profile!r}: choose one of "
                         f"{', '.join(PROFILES)}, or give rate and delay.")
    if rate is not None:
        chosen = replace(chosen, name="custom", rate_bits=parse_rate(rate))
    if delay is not None:
        chosen = replace(chosen, name="custom", delay_s=parse_delay(delay))
    return chosen


# ---------------------------------------------------------------- can it run here?

def _ip(*args, check=True, namespace=None) -> subprocess.CompletedProcess:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise ClusterError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done


_probe_result: dict = {}


def unavailable() -> str | None:
    """Return why a cluster cannot be built here (one line), or None if it can.

    Checks: Linux, root, ``ip``/``tc``/``unshare`` on PATH, and that a network
    namespace can really be created (root in a container without NET_ADMIN cannot).
    """
    if "reason" in _probe_result:
        return _probe_result["reason"]
    reason = None
    if not sys.platform.startswith("linux"):
        reason = _("needs Linux network namespaces (this is {platform})").format(
            platform=sys.platform)
    elif os.geteuid() != 0:
        reason = _("needs root (uid {uid} here): network namespaces and tc need "
                   "CAP_NET_ADMIN; as root, or in a container started with "
                   "--cap-add NET_ADMIN --cap-add SYS_ADMIN").format(uid=os.geteuid())
    else:
        missing = [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]
        if missing:
            reason = _("needs {tools} on PATH (Debian/Ubuntu: apt-get install iproute2 "
                       "util-linux)").format(tools=", ".join(missing))
    if reason is None:
        probe = f"{PREFIX}{os.getpid()}-0-sw"   # `down --stale` finds it if left
        done = _ip("netns", "add", probe, check=False)
        if done.returncode != 0:
            reason = _("cannot create a network namespace ({error}): in a container, "
                       "start it with --cap-add NET_ADMIN --cap-add SYS_ADMIN").format(
                           error=done.stderr.strip())
        else:
            _probe_result["netem"] = _probe_netem(probe)
            _ip("netns", "del", probe, check=False)
    _probe_result["reason"] = reason
    return reason


def _probe_netem(namespace: str) -> bool:
    """Can this kernel add a delay (sch_netem)? Tried on the probe namespace's lo."""
    done = subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root",
                           "netem", "delay", "1us"], capture_output=True, text=True)
    return done.returncode == 0


def has_netem() -> bool:
    """Tell whether this kernel can add a delay to a link (tc's netem qdisc)."""
    return unavailable() is None and _probe_result.get("netem", False)


# ---------------------------------------------------------------- names and cleanup

def existing() -> list[str]:
    """Return the namespaces of every cluster on this machine (``lkc<pid>-<n>-*``)."""
    done = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if _NAME.match(n))


def _pids(namespace: str) -> list[int]:
    done = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split() if p.strip().isdigit()]


def _kill_namespace(namespace: str, grace: float) -> None:
    """SIGTERM every process in the namespace, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = _pids(namespace)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _pids(namespace)
        if not pids:
            return


def remove(namespaces, grace: float = 2.0) -> None:
    """Kill every process in ``namespaces``, delete them and their /etc/netns files."""
    for namespace in namespaces:
        _kill_namespace(namespace, grace)
        _ip("netns", "del", namespace, check=False)
        shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
    try:
        NETNS_ETC.rmdir()   # only if empty: another cluster may be using it
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(name: str | None = None) -> dict:
    """Return what a cluster (all of them if ``name`` is None) left on this machine.

    ``namespaces``: its network namespaces; ``etc``: its ``/etc/netns`` folders.
    Veths, addresses, bridges and qdiscs exist only inside those namespaces: once
    they are gone, so is all of it (the tests also compare the host's own links and
    qdiscs before and after).
    """
    def mine(namespace: str) -> bool:
        match = _NAME.match(namespace)
        return bool(match) and (name is None or match.group(1) == name)

    etc = sorted(p.name for p in NETNS_ETC.glob("*")) if NETNS_ETC.is_dir() else []
    return {"namespaces": [n for n in existing() if mine(n)],
            "etc": [n for n in etc if mine(n)]}


# ---------------------------------------------------------------- the cluster

class Cluster:
    """``nodes`` network namespaces on a shaped link; a context manager.

    >>> with Cluster(nodes=2, profile="1gbe") as cluster:      # doctest: +SKIP
    ...     cluster.run("node1", ["hostname"]).stdout
    'node1\\n'

    ``profile``: a name of ``PROFILES`` or a ``Link``; ``rate`` ("1gbit") and
    ``delay`` ("50us") override it. ``require_delay``: fail when the kernel cannot
    add the delay (no netem) instead of shaping the rate alone and saying so.
    ``aliases``: more names per node in every node's /etc/hosts, e.g.
    ``{"node0": ["course-ddp-node-0-0.course-ddp"]}`` (a pod's DNS name).
    ``gpus=False`` (the default) hides the machine's GPUs from every command
    (``CUDA_VISIBLE_DEVICES=""`` unless ``env`` sets it): the nodes would all share
    them, and NCCL refuses two ranks on one GPU, so each node is a CPU node.
    """

    def __init__(self, nodes: int = 2, profile="1gbe", rate=None, delay=None,
                 require_delay: bool = False, verbose: bool = True,
                 aliases: dict | None = None, gpus: bool = False):
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 2 <= nodes <= 4:
            raise ValueError(f"nodes must be 2, 3 or 4, got {nodes!r}.")
        self.link = link(profile, rate, delay)
        self.nodes = [f"node{i}" for i in range(nodes)]
        self.name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.require_delay = require_delay
        self.gpus = gpus
        self.aliases = {self._node(n): [names] if isinstance(names, str) else
                        list(names) for n, names in (aliases or {}).items()}
        self.verbose = verbose
        self.delay_shaped = False
        self.up = False
        self._processes: list[subprocess.Popen] = []
        self._saved_handlers: dict = {}

    # names
    def namespace(self, node) -> str:
        """Return the network namespace of ``node`` (``"node1"`` or 1)."""
        return f"{self.name}-{self._node(node)}"

    def _node(self, node) -> str:
        name = f"node{node}" if isinstance(node, int) else str(node)
        if name not in self.nodes:
            raise ValueError(f"Unknown node {node!r}: this cluster has "
                             f"{', '.join(self.nodes)}.")
        return name

    def address(self, node) -> str:
        """Return ``node``'s IPv4 address (10.77.0.1 for node0, ...)."""
        return f"{SUBNET}.{self.nodes.index(self._node(node)) + 1}"

    def hostname(self, node) -> str:
        """Return ``node``'s host name: what ``hostname`` prints inside it."""
        return self._node(node)

    @property
    def namespaces(self) -> list[str]:
        return [f"{self.name}-sw"] + [self.namespace(n) for n in self.nodes]

    # life cycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self) -> "Cluster":
        """Build the switch, the nodes and the link (on error, remove what exists)."""
        reason = unavailable()
        if reason:
            raise ClusterError(f"cluster in a box {reason}.")
        if self.link.delay_s and not has_netem() and self.require_delay:
            raise ClusterError(
                f"this kernel has no netem (CONFIG_NET_SCH_NETEM), so a delay of "
                f"{self.link.delay_s * 1e6:g} us cannot be added; the rate alone can "
                "be shaped (tbf): drop --delay, or use a kernel with sch_netem.")
        self._catch_signals()
        atexit.register(self.stop)
        self.up = True    # from here on, stop() removes whatever exists
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        if self.verbose:
            print(self.describe())
        return self

    def _build(self) -> None:
        switch = f"{self.name}-sw"
        _ip("netns", "add", switch)
        _ip("link", "add", "br0", "type", "bridge", namespace=switch)
        _ip("link", "set", "br0", "up", namespace=switch)
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{self.address(n)} {' '.join([n, *self.aliases.get(n, [])])}\n"
            for n in self.nodes)
        for i, node in enumerate(self.nodes):
            ns, port = self.namespace(node), f"p{i}"
            _ip("netns", "add", ns)
            _ip("link", "set", "lo", "up", namespace=ns)
            _ip("link", "add", IFNAME, "type", "veth", "peer", "name", port, "netns",
                switch, namespace=ns)
            _ip("link", "set", port, "master", "br0", "up", namespace=switch)
            _ip("addr", "add", f"{self.address(node)}/24", "dev", IFNAME, namespace=ns)
            _ip("link", "set", IFNAME, "up", namespace=ns)
            self._shape(ns)
            self._write_hosts(ns, hosts)

    def _write_hosts(self, namespace: str, hosts: str) -> None:
        for attempt in range(5):   # another cluster may rmdir an empty /etc/netns
            try:
                (NETNS_ETC / namespace).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / namespace / "hosts").write_text(hosts)
                return
            except FileNotFoundError:
                if attempt == 4:
                    raise

    def _tc(self, namespace: str, *args) -> subprocess.CompletedProcess:
        command = ["tc", "-n", namespace, "qdisc", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    def _shape(self, namespace: str) -> None:
        """tbf for the rate; netem (tbf's parent, as in tc's examples) for the delay."""
        rate, delay = self.link.rate_bits, self.link.delay_s
        parent = ["root"]
        if delay and has_netem():
            done = self._tc(namespace, "add", "dev", IFNAME, "root", "handle", "1:",
                            "netem", "delay", f"{delay * 1e6:.0f}us", "limit", "100000")
            if done.returncode != 0:
                raise ClusterError(f"tc netem failed: {done.stderr.strip()}")
            parent = ["parent", "1:1", "handle", "10:"]
            self.delay_shaped = True
        if rate:
            # The bucket holds 1 ms of traffic, and at least BURST: smaller buckets
            # split each 64 KiB GSO packet and, on 2 loaded cores, miss the rate.
            burst = max(BURST, int(rate / 8 * 1e-3))
            done = self._tc(namespace, "add", "dev", IFNAME, *parent, "tbf", "rate",
                            f"{int(rate)}bit", "burst", str(burst), "latency", "100ms")
            if done.returncode != 0:
                raise ClusterError(f"tc tbf failed: {done.stderr.strip()}")

    def describe(self) -> str:
        """Say what was built: the nodes, their addresses and the link."""
        delay = ""
        if self.link.delay_s and not self.delay_shaped:
            delay = _(" (delay NOT added: this kernel has no netem; only the rate is "
                      "shaped)")
        nodes = ", ".join(f"{n} {self.address(n)}" for n in self.nodes)
        return _("cluster {name}: {nodes}; link {link}{delay}").format(
            name=self.name, nodes=nodes, link=self.link.describe(), delay=delay)

    def stop(self) -> None:
        """Kill every process in the nodes and remove the namespaces (idempotent)."""
        if not self.up:
            return
        self.up = False
        blocked = self._block_signals()   # a second Ctrl-C must not stop the teardown
        try:
            for process in self._processes:
                if process.poll() is None:
                    try:
                        process.kill()
                    except ProcessLookupError:
                        pass
            remove(self.namespaces)
            for process in self._processes:
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self._restore_signals(blocked)
            atexit.unregister(self.stop)

    # signals: SIGTERM (and SIGHUP) become an exception, so `finally`/__exit__ run
    def _catch_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(sig)
            if previous in (signal.SIG_DFL, None):
                self._saved_handlers[sig] = previous
                signal.signal(sig, _raise_interrupt)

    def _block_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        saved = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            saved[sig] = signal.signal(sig, signal.SIG_IGN)
        return saved

    def _restore_signals(self, blocked: dict) -> None:
        for sig, handler in blocked.items():
            signal.signal(sig, handler)
        for sig, handler in self._saved_handlers.items():
            if signal.getsignal(sig) is _raise_interrupt:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._saved_handlers = {}

    # commands
    def command(self, node, cmd) -> list[str]:
        """Return the argv that runs ``cmd`` (a list, or a shell string) in ``node``."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        return command_in(self.namespace(node), self.hostname(node), argv)

    def popen(self, node, cmd, env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start ``cmd`` in ``node``; ``env`` is added to this process's environment.

        The process is killed at teardown if it is still running.
        """
        self._check_up()
        hidden = {} if self.gpus else {"CUDA_VISIBLE_DEVICES": ""}
        full = {**os.environ, **hidden, **(env or {})}
        process = subprocess.Popen(self.command(node, cmd), env=full, **kwargs)
        self._processes.append(process)
        self._wait_until_inside(node, process)
        return process

    def _wait_until_inside(self, node, process, timeout: float = 10.0) -> None:
        """Return once ``process`` has entered ``node``'s namespace (or exited).

        ``ip netns exec`` joins the namespace a moment after it starts; until
        then ``pids`` and ``kill_node`` would not see the process, so a node
        killed right after ``popen`` would keep it running.
        """
        namespace = self.namespace(node)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if process.pid in _pids(namespace):
                return
            time.sleep(0.01)

    def run(self, node, cmd, env: dict | None = None, timeout: float = 300,
            check: bool = False, capture: bool = True, **kwargs):
        """Run ``cmd`` in ``node`` and wait: like ``subprocess.run`` (text output)."""
        if capture:
            kwargs.setdefault("stdout", subprocess.PIPE)
            kwargs.setdefault("stderr", subprocess.PIPE)
        process = self.popen(node, cmd, env, text=True, start_new_session=True,
                             **kwargs)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_node(node)
            out, err = process.communicate()
            raise ClusterError(f"{cmd!r} on {node} ran past {timeout} s: every "
                               f"process in {node} was killed.\n{(err or '')[-2000:]}")
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        if check and done.returncode != 0:
            raise ClusterError(f"{cmd!r} on {node} exited with {done.returncode}:\n"
                               f"{(err or out or '')[-3000:]}")
        return done

    def pids(self, node) -> list[int]:
        """Return the pids of every process running in ``node``."""
        return _pids(self.namespace(node))

    def kill_node(self, node, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process in ``node`` (a node that dies); return them."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def link_down(self, node) -> None:
        """Take ``node``'s link down (its cable pulled): its packets go nowhere."""
        self._check_up()
        _ip("link", "set", IFNAME, "down", namespace=self.namespace(node))

    def link_up(self, node) -> None:
        """Bring ``node``'s link back up (same address, same shaping)."""
        self._check_up()
        _ip("link", "set", IFNAME, "up", namespace=self.namespace(node))

    def _check_up(self) -> None:
        if not self.up:
            raise ClusterError(f"cluster {self.name} is not up: `with Cluster(...)`.")

    # ranks on the nodes
    def launch(self, worker, args: tuple = (), nproc_per_node: int = 1,
               timeout: float = 120.0, deadline: float = 600.0,
               env: dict | None = None, threads_per_rank: int = 1) -> list:
        """Run ``worker(ctx, *args)`` on every node's ranks (gloo); return the results.

        Like ``launch.run``, but rank r runs in node ``r // nproc_per_node`` and the
        ranks meet at node0's address: every collective crosses the shaped link
        (between nodes) or the node's loopback (within one). ``worker`` must be
        importable by name (a module-level function). ``timeout`` bounds each
        collective; ``deadline`` the whole launch.
        """
        self._check_up()
        world = nproc_per_node * len(self.nodes)
        with tempfile.TemporaryDirectory(prefix="labkit-cluster-") as folder:
            spec = {"module": worker.__module__, "qualname": worker.__qualname__,
                    "args": args, "world_size": world, "local_world_size":
                    nproc_per_node, "master": self.address(0), "timeout": timeout,
                    "threads": threads_per_rank}
            Path(folder, "spec.pkl").write_bytes(pickle.dumps(spec))
            ranks = []
            path = os.pathsep.join([os.getcwd(), *sys.path])
            for rank in range(world):
                node = self.nodes[rank // nproc_per_node]
                log = open(Path(folder, f"rank{rank}.log"), "w")
                ranks.append(self.popen(
                    node, [sys.executable, "-m", "labkit.cluster", "_rank", folder,
                           str(rank)], env={"PYTHONPATH": path, "OMP_NUM_THREADS":
                                            str(threads_per_rank), **(env or {})},
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
                log.close()
            try:
                return _collect(ranks, folder, deadline)
            finally:
                for process in ranks:
                    if process.poll() is None:
                        process.kill()
                    process.wait()


def command_in(namespace: str, hostname: str, argv: list[str]) -> list[str]:
    """The argv running ``argv`` in a namespace, under its own host name."""
    return ["ip", "netns", "exec", namespace, "unshare", "--uts", "--", "sh", "-c",
            _SET_HOSTNAME, hostname, *argv]


class _Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread is (cleanup runs)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupt(signum, frame):
    raise _Interrupted(signum)


def _collect(ranks: list, folder: str, deadline: float) -> list:
    """Wait for every rank; return their results or raise the first rank's error."""
    end = time.monotonic() + deadline
    while any(p.poll() is None for p in ranks):
        if any(p.poll() not in (None, 0) for p in ranks) or time.monotonic() > end:
            break
        time.sleep(0.05)
    for other in ranks:          # a rank that failed: the others are stopped
        if other.poll() is None:
            other.kill()
        other.wait()
    outcomes = {}
    for rank in range(len(ranks)):
        path = Path(folder, f"result{rank}.pkl")
        if path.exists():
            outcomes[rank] = pickle.loads(path.read_bytes())
    for rank, (kind, value) in outcomes.items():
        if kind != "ok":
            raise ClusterError(f"rank {rank} raised:\n{value}")
    missing = [r for r in range(len(ranks)) if r not in outcomes]
    if missing:
        logs = "\n".join(
            f"--- rank {r} (exit {p.returncode}):\n"
            f"{Path(folder, f'rank{r}.log').read_text()[-2500:]}"
            for r, p in enumerate(ranks))
        what = "ran past the deadline" if time.monotonic() > end else "failed"
        raise ClusterError(f"rank {missing[0]} {what}.\n{logs}")
    return [outcomes[r][1] for r in range(len(ranks))]


def _rank_main(folder: str, rank: int) -> None:
    """In a node: join the group at node0's address, run the worker, save the result."""
    import datetime
    import importlib

    spec = pickle.loads(Path(folder, "spec.pkl").read_bytes())
    local_world = spec["local_world_size"]
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(spec["world_size"]),
                       "LOCAL_RANK": str(rank % local_world),
                       "LOCAL_WORLD_SIZE": str(local_world),
                       "MASTER_ADDR": spec["master"], "MASTER_PORT": str(MASTER_PORT),
                       "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME",
                                                            IFNAME)})
    import torch
    import torch.distributed as dist

    from labkit.launch import RankContext

    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", init_method="env://", rank=rank,
                            world_size=spec["world_size"],
                            timeout=datetime.timedelta(seconds=spec["timeout"]))
    ctx = RankContext(rank, spec["world_size"], rank % local_world, "gloo",
                      torch.device("cpu"))
    worker = importlib.import_module(spec["module"])
    for part in spec["qualname"].split("."):
        worker = getattr(worker, part)
    try:
        outcome = ("ok", worker(ctx, *spec["args"]))
    except Exception:
        outcome = ("error", traceback.format_exc())
    tmp = Path(folder, f"result{rank}.pkl.tmp")
    tmp.write_bytes(pickle.dumps(outcome))
    os.replace(tmp, Path(folder, f"result{rank}.pkl"))
    sys.stdout.flush()
    sys.stderr.flush()
    if outcome[0] == "ok":
        dist.barrier()            # every rank is done before the group goes
        dist.destroy_process_group()
    # No interpreter shutdown: gloo's threads and DDP hooks' futures torn down by
    # Python's finalizers aborted a rank here ("Resource deadlock avoided").
    os._exit(0 if outcome[0] == "ok" else 1)


# ---------------------------------------------------------------- command line

def _find(name: str | None) -> str:
    """Return the cluster to use: ``name``, $LABKIT_CLUSTER, or the only one up."""
    name = name or os.environ.get("LABKIT_CLUSTER")
    clusters = sorted({_NAME.match(n).group(1) for n in existing()})
    if name:
        if name not in clusters:
            raise ClusterError(f"no cluster {name!r} is up (up: "
                               f"{', '.join(clusters) or 'none'}).")
        return name
    if len(clusters) != 1:
        raise ClusterError(f"{len(clusters)} clusters are up "
                           f"({', '.join(clusters) or 'none'}): say which with "
                           "--cluster NAME.")
    return clusters[0]


def _cmd_up(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cluster = Cluster(args.nodes, args.profile, args.rate, args.delay,
                      require_delay=args.delay is not None)
    with cluster:
        state = {"name": cluster.name, "nodes": {n: cluster.address(n)
                                                 for n in cluster.nodes},
                 "link": cluster.link.describe(), "delay_shaped": cluster.delay_shaped}
        print(f"ready: {json.dumps(state)}", flush=True)
        if not command:
            print(f"run a command in a node: {sys.argv[0]} run --cluster "
                  f"{cluster.name} node0 -- hostname\nCtrl-C or SIGTERM tears it "
                  "all down.", flush=True)
            while True:
                time.sleep(3600)
        process = subprocess.Popen(command, env={**os.environ,
                                                 "LABKIT_CLUSTER": cluster.name})
        try:
            return process.wait()
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()


def _cmd_run(args) -> int:
    name = _find(args.cluster)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ClusterError("say what to run: run NODE -- COMMAND ...")
    node = f"node{args.node}" if args.node.isdigit() else args.node
    namespace = f"{name}-{node}"
    if namespace not in existing():
        raise ClusterError(f"cluster {name} has no {node}.")
    argv = command_in(namespace, node, command)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")   # CPU nodes (see Cluster)
    os.execvp(argv[0], argv)   # signals and exit code go straight to the command
    return 0   # not reached


def _cmd_list(args) -> int:
    clusters: dict = {}
    for namespace in existing():
        match = _NAME.match(namespace)
        clusters.setdefault(match.group(1), []).append(match.group(3))
    for name, parts in sorted(clusters.items()):
        pid = int(_NAME.match(f"{name}-sw").group(2)) if parts else 0
        alive = "running" if _alive(pid) else "STALE (its process is gone)"
        print(f"{name}: {', '.join(sorted(parts))} [{alive}]")
    if not clusters:
        print("no cluster is up.")
    return 0


def _cmd_down(args) -> int:
    names = set(args.names)
    if args.stale:
        names |= {m.group(1) for m in map(_NAME.match, existing())
                  if not _alive(int(m.group(2)))}
    targets = [n for n in existing() if _NAME.match(n).group(1) in names]
    remove(targets)
    print(f"removed {len(targets)} namespace(s) of {len(names)} cluster(s).")
    return 0


def _cmd_check(args) -> int:
    reason = unavailable()
    if reason:
        print(f"cluster in a box: {reason}.")
        return 1
    print("cluster in a box: can run here (root, ip, tc, unshare; namespaces work); "
          f"delay {'can' if has_netem() else 'CANNOT (no netem in this kernel)'} be "
          "added, rate can be shaped (tbf).")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cluster.py", description="A cluster in a box: N network-namespace nodes "
        "on a shaped link (needs root).")
    verbs = parser.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="bring a cluster up; tear it down on exit, error "
                          "or Ctrl-C/SIGTERM")
    up.add_argument("--nodes", type=int, default=2, help="2 to 4 (default 2)")
    up.add_argument("--profile", default="1gbe", choices=sorted(PROFILES),
                    help="link profile (default 1gbe)")
    up.add_argument("--rate", help="override the rate, tc units: 1gbit, 250mbit")
    up.add_argument("--delay", help="override the one-way delay: 50us, 2ms "
                    "(needs netem in the kernel)")
    up.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- COMMAND: run it on the host with $LABKIT_CLUSTER set, "
                    "then tear down (without: hold until interrupted)")
    up.set_defaults(run=_cmd_up)
    run = verbs.add_parser("run", help="run a command inside a node")
    run.add_argument("--cluster", help="its name (default $LABKIT_CLUSTER, or the "
                     "only one up)")
    run.add_argument("node", help="node0, node1, ... (or 0, 1, ...)")
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(run=_cmd_run)
    verbs.add_parser("list", help="the clusters that are up").set_defaults(
        run=_cmd_list)
    down = verbs.add_parser("down", help="remove clusters by name, or the stale ones")
    down.add_argument("names", nargs="*")
    down.add_argument("--stale", action="store_true",
                      help="every cluster whose process is gone (a SIGKILLed run)")
    down.set_defaults(run=_cmd_down)
    verbs.add_parser("check", help="can a cluster run here? (exit 1 if not)"
                     ).set_defaults(run=_cmd_check)
    return parser


def main(argv=None) -> int:
    """The command line (env/cluster/cluster.py); errors print as one clear line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_rank"]:          # a rank of Cluster.launch, inside a node
        _rank_main(argv[1], int(argv[2]))
        return 0
    args = _parser().parse_args(argv)
    if args.verb != "check":
        reason = unavailable()
        if reason:
            print(f"cluster.py: cluster in a box {reason}.", file=sys.stderr)
            return 2
    try:
        return args.run(args)
    except _Interrupted as stop:
        return 128 + stop.signum
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except (ClusterError, ValueError) as err:
        print(f"cluster.py: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
