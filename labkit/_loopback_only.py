"""Bring up loopback in a fresh network namespace, then run a command there.

``unshare --user --map-root-user --net python -m labkit._loopback_only CMD ...``: the
new namespace has only ``lo``, and it starts down. Whatever CMD listens on (torchrun's
stores bind every interface, "::") is then reachable from loopback inside the
namespace only: not from the network, and not from other users of the machine.
Used by ``privacy.loopback_only``.
"""

import fcntl
import os
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"   # struct ifreq: the name, the flags, padding to its 40 bytes


def bring_up(name: str = "lo") -> None:
    """Set the IFF_UP flag of interface ``name`` (as ``ip link set lo up`` does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(IFREQ, name.encode(), 0)
        flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, name.encode(), flags | IFF_UP))


if __name__ == "__main__":
    bring_up()
    os.execvp(sys.argv[1], sys.argv[1:])
