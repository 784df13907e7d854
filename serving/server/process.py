"""``hvdk8s serve`` as a child process: started, waited for, and stopped (benchmarks, tests, scripts)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Served:
    url: str  # REST root, http://HOST:PORT
    grpc: str  # gRPC address, HOST:PORT
    pid: int
    process: subprocess.Popen = field(repr=False, compare=False)


@contextlib.contextmanager
def running(base_path: str | os.PathLike[str], log: str | os.PathLike[str], *args: str) -> Iterator[Served]:
    """``hvdk8s serve BASE_PATH --port 0 --grpc-port 0 ARGS`` until the block ends; its stderr goes to ``log``.

    Yields once the server prints its addresses, which it does after its first scan of the base path
    whatever that loaded (a version that failed to load is only logged; an empty base path is no error);
    raises ``RuntimeError`` with the log if it exits or prints something else first.
    """
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvdk8s.cli", "serve", os.fspath(base_path), "--port", "0", "--grpc-port", "0",
             *args],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    assert proc.stdout is not None  # stdout=PIPE
    try:
        line = proc.stdout.readline()
        if "http://" not in line or " grpc " not in line:
            raise RuntimeError(f"hvdk8s serve did not start: {line!r}\n{Path(log).read_text()[-4000:]}")
        yield Served(line[line.index("http://"):].split("/v1/")[0], line.split(" grpc ")[1].split()[0], proc.pid, proc)
    finally:
        proc.terminate()  # graceful: uvicorn and the gRPC server drain, then the process exits
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()
            proc.stdout.close()
