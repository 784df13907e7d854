"""TCP link check between two emulated hosts: full-duplex throughput and small-message round trip.

    python -m hvdk8s.benchmarks.emulation.linkprobe serve PORT
    python -m hvdk8s.benchmarks.emulation.linkprobe probe HOST PORT BYTES ROUNDTRIPS OUT.json

After ``ROUNDTRIPS`` one-byte ping-pongs, both ends send ``BYTES`` at once on
one connection, as the two neighbours of a ring do. Shows what a shaped link
delivers to an application (TCP/IP and veth overheads included) before any
collective runs over it.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> None:
    while n:
        got = conn.recv(min(n, CHUNK))
        if not got:
            raise ConnectionError("peer closed early")
        n -= len(got)


def _send(conn: socket.socket, n: int) -> None:
    payload = bytes(CHUNK)
    while n:
        k = min(n, CHUNK)
        conn.sendall(payload[:k])
        n -= k


def _duplex(conn: socket.socket, total: int) -> None:
    sender = threading.Thread(target=_send, args=(conn, total))
    sender.start()
    _recv_exact(conn, total)
    sender.join()


def serve(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as srv:
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pings, total = (int(x) for x in conn.recv(32).decode().split())
            for _ in range(pings):
                _recv_exact(conn, 1)
                conn.sendall(b"p")
            _duplex(conn, total)
            _recv_exact(conn, 1)


def _connect(host: str, port: int) -> socket.socket:
    deadline = time.monotonic() + 30
    while True:
        try:
            return socket.create_connection((host, port), timeout=60)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def probe(host: str, port: int, total: int, pings: int) -> dict[str, object]:
    with _connect(host, port) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(f"{pings} {total}".ljust(32).encode())
        rtts = []
        for _ in range(pings):
            start = time.perf_counter()
            conn.sendall(b"x")
            _recv_exact(conn, 1)
            rtts.append(time.perf_counter() - start)
        start = time.perf_counter()
        _duplex(conn, total)
        seconds = time.perf_counter() - start
        conn.sendall(b"k")
    return {"bytes": total, "seconds": seconds, "roundtrip_seconds": rtts}


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]))
    elif argv[:1] == ["probe"]:
        result = probe(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
        with open(argv[5], "w") as fh:
            json.dump(result, fh)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
