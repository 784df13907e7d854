"""The environment block of a report: enough to reproduce a run or explain its numbers."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .launch import CHECKOUT, MPI_MCA

# Variables that change what the benchmark measures (not every TF_*: Terraform uses that prefix too).
FLAG_PREFIXES = ("HOROVOD_", "OMPI_", "OMP_", "HVDK8S_", "TF_CPP_", "TF_ENABLE_", "TF_XLA_", "TF_NUM_", "KERAS_")
PACKAGES = ("tensorflow", "tensorflow-cpu", "keras", "horovod", "numpy", "mpi4py", "matplotlib")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _first_line(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def git_commit() -> dict[str, Any]:
    """HEAD of the checkout the benchmarks run from, and whether the tree had local changes (None: an installed
    package, or no git)."""
    if CHECKOUT is None or shutil.which("git") is None:
        return {"commit": None, "dirty": None}
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain"], capture_output=True, text=True)
    if head.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def stack_versions(load_ops: bool = True) -> dict[str, str]:
    """The interpreter, TensorFlow, Keras and Horovod this process runs, from the imported modules
    (what really ran, whichever distribution installed it), and where ``hvdk8s`` was imported from.
    ``load_ops``: also import ``horovod.tensorflow``, whose op library fails to load where Horovod was
    built for another TensorFlow (the check before a launch; a worker that ran has no need)."""
    import horovod

    if load_ops:
        import horovod.tensorflow  # noqa: F401
    import keras
    import tensorflow as tf

    import hvdk8s

    return {"executable": sys.executable, "python": platform.python_version(), "tensorflow": tf.__version__,
            "keras": keras.__version__, "horovod": horovod.__version__, "hvdk8s": str(Path(hvdk8s.__file__).parent)}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def collect(command: list[str]) -> dict[str, Any]:
    return {
        "command": command,
        "python": sys.version.split()[0],
        "packages": {p: v for p in PACKAGES if (v := _version(p))},
        "open_mpi": _first_line(["mpirun", "--version"]),
        "iproute2": _first_line(["ip", "-V"]),
        "kernel": platform.release(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "git": git_commit(),
        "mpi_mca": MPI_MCA,
        "environment_flags": {k: v for k, v in sorted(os.environ.items()) if k.startswith(FLAG_PREFIXES)},
        "load_average_start": load_average(),
    }
