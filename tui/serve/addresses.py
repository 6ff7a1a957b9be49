"""Where a browser reaches `trackside serve`: the address it listens on, or, where that is a
wildcard (0.0.0.0, ::), this machine's own addresses and its name — a URL of 0.0.0.0
opens nothing anywhere else."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

WILDCARDS = {"0.0.0.0": socket.AF_INET, "::": socket.AF_INET6}
SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address
IF_INET6 = "/proc/net/if_inet6"  # Linux's IPv6 addresses: hex address, index, prefix, scope, flags, name
GLOBAL_SCOPE = 0  # if_inet6's scope of an address others can reach (link-local ones need a zone)


def url_hosts(host: str) -> list[str]:
    """The hosts to open the server at, as a URL writes them (an IPv6 one in brackets):
    `host` itself, or for a wildcard each non-loopback address of this machine's interfaces
    of its family (read as Linux keeps them; elsewhere none), then the machine's name."""
    family = WILDCARDS.get(host)
    if family is None:
        return [_in_url(host)]
    found = _ipv4() if family == socket.AF_INET else _ipv6()
    usable = [a for a in found if not (a.is_loopback or a.is_link_local or a.is_unspecified)]
    return [*dict.fromkeys(_in_url(str(a)) for a in usable), socket.gethostname()]


def _in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _ipv4() -> list[ipaddress.IPv4Address]:
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # asks the kernel; sends nothing
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it, or not Linux
                continue
            found.append(ipaddress.IPv4Address(answer[20:24]))
    return found


def _ipv6() -> list[ipaddress.IPv6Address]:
    try:
        with open(IF_INET6) as table:
            rows = [line.split() for line in table]
    except OSError:  # not Linux, or no IPv6
        return []
    return [ipaddress.IPv6Address(bytes.fromhex(row[0])) for row in rows
            if len(row) == 6 and len(row[0]) == 32 and int(row[3], 16) == GLOBAL_SCOPE]
