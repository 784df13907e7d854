"""Free localhost ports for the benchmark's jobs (atomic writes are ``hvdk8s.common.atomic``'s)."""
from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ephemeral ports, all held open until chosen so none repeats."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
