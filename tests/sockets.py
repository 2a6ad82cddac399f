"""What a process listens on, read from /proc: tests check that every server and store they
start accepts connections on the loopback address only, never on all interfaces.

    for socket in listening_sockets(pid):   # pid of a server, or None for this process
        assert socket.address.is_loopback
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass

LISTEN = "0A"  # the TCP state column of /proc/net/tcp


@dataclass(frozen=True)
class Listening:
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback_only(self) -> bool:
        mapped = getattr(self.address, "ipv4_mapped", None)
        return (mapped or self.address).is_loopback

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


def listening_sockets(pid: int | None = None) -> list[Listening]:
    """The TCP sockets the process (this one by default) has open in the LISTEN state."""
    inodes = _socket_inodes(pid or os.getpid())
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.append(Listening(_address(address), int(port, 16)))
    return sorted(found, key=str)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for descriptor in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue  # closed since the listing
        match = re.fullmatch(r"socket:\[(\d+)\]", target)
        if match:
            inodes.add(match.group(1))
    return inodes


def _address(hex_text: str):
    """/proc writes an address as 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_text)
    in_order = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(in_order)


# A command run after this prefix sees a network of its own with the loopback interface alone:
# torchrun's store, which listens on every interface whatever address it is given, is then
# reachable from this machine only.
LOOPBACK_NAMESPACE = ["unshare", "--map-root-user", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def in_loopback_namespace(argv: list[str]) -> list[str] | None:
    """argv run inside a new network namespace holding only a loopback interface, or None
    where this machine cannot make one (no unshare or ip, or user namespaces refused)."""
    try:
        probe = subprocess.run([*LOOPBACK_NAMESPACE, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [*LOOPBACK_NAMESPACE, *argv] if probe.returncode == 0 else None
