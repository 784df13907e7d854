"""Small shared helpers: atomic JSON writes and free localhost ports."""
from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """JSON through ``write_text_atomic``."""
    return write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write through a temporary file in the same folder and rename: readers never see half a file."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, final)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
