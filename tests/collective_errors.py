"""Errors as Horovod, Gloo and MPI really raise them in an elastic job, rebuilt for the classification tests.

``collective_errors.json`` holds errors recorded from real runs (a 2-host elastic
job, ``localhost:1`` + ``127.0.0.1:1``, whose rank 1 was SIGKILLed or SIGSTOPped):
type, message and the Python traceback's files, innermost last, with this
machine's paths as ``{site}`` (site-packages), ``{repo}`` and ``{script}``. The
other shapes are derived from them the way Horovod v0.28.1 builds its statuses
(each ``derive`` entry names the code that does).
"""
from __future__ import annotations

import functools
import json
import sysconfig
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

REPO = Path(__file__).resolve().parents[1]
RECORDED = json.loads((Path(__file__).with_name("collective_errors.json")).read_text())
SITE = sysconfig.get_paths()["purelib"]
SHUT_DOWN = (
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to allreduce, "
    "allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown was caused by an "
    "exception, you should see the exception in the log before the first shutdown message."
)


def _paths(text: str) -> str:
    return text.replace("{site}", SITE).replace("{repo}", str(REPO)).replace("{script}", str(REPO / "train.py"))


def recorded(name: str, status: str | None = None, kind: str | None = None) -> tuple[type, str, list[str]]:
    """A recorded error (type, message, traceback files); ``status`` replaces Horovod's shutdown text, as
    another status of the same op would read, and ``kind`` the TensorFlow error class."""
    case = RECORDED[name]
    message = _paths(case["message"])
    if status is not None:
        message = message.replace(SHUT_DOWN, status)
    return getattr(tf.errors, kind or case["type"]), message, [_paths(f) for f in case["frames"]]


def raised(error_type: type, message: str, files: list[str]) -> BaseException:
    """The error, raised and caught for real through frames whose code lives in ``files`` (innermost last)."""
    err = error_type(None, None, message) if issubclass(error_type, tf.errors.OpError) else error_type(message)

    def innermost() -> None:  # the innermost frame's callee: returns, as the raising frame never calls it
        return None

    call: Callable[[], None] = innermost
    for i, file in enumerate(reversed(files)):
        body = "raise err" if i == 0 else "inner()"  # the innermost recorded frame raises
        namespace: dict = {"err": err}
        exec(compile(f"def frame_{i}(inner):\n    {body}\n", file, "exec"), namespace)
        call = functools.partial(namespace[f"frame_{i}"], call)  # partial: no frame of this file between
    try:
        call()
    except BaseException as caught:  # noqa: BLE001 (the point: any error, as raised)
        return caught
    raise AssertionError("not raised")


# Gloo's exceptions as Horovod's PerformOperation turns them into a status (operations.cc:325,
# Status::UnknownError(ex.what())); the texts are those of the runs recorded here (Gloo's tcp/pair.cc).
GLOO_RESET = ("[/tmp/tmp.SKL3Bzrt4s/horovod-0.28.1/third_party/compatible17_gloo/gloo/transport/tcp/pair.cc:589] "
              "Read error [127.0.0.1]:29068: Connection reset by peer")
MPI_FAILED = "MPI_AllReduce failed, see MPI output for details."  # horovod/common/mpi/mpi_controller.cc:121
PROCESS_SET_REMOVED = "Process set has been removed"  # horovod/common/process_set.h:87, Status::Aborted
MISMATCHED_SHAPES = ("Mismatched allreduce tensor shapes: One rank sent a tensor of shape [10], but another rank "
                     "sent a tensor of shape [11].")  # horovod/common/controller.cc, a PRECONDITION_ERROR
