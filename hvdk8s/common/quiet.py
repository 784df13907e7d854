"""TensorFlow's start-up lines off by default for every ``hvdk8s`` command and the ranks it launches.

Each process that loads TensorFlow prints its C++ INFO and WARNING lines (the CPU feature guard, absl's
"All log messages before absl::InitializeLog()"), once per rank: noise a user reads as a problem. The CLI
sets ``TF_CPP_MIN_LOG_LEVEL=2`` (errors still print) in its own environment, which the launched ranks inherit
(``hvdk8s run`` forwards ``TF_*`` and ``HVDK8S_*`` with ``mpirun -x``); ``hvdk8s render`` gives every pod of
a rendered job the same default through its env. A value the user set (or a job file's env) is kept;
``hvdk8s --verbose`` or ``HVDK8S_VERBOSE=1`` leaves TensorFlow's own default (everything printed).
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

VERBOSE = "HVDK8S_VERBOSE"
TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = "2"  # TensorFlow's C++ levels: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR


def is_verbose(environ: MutableMapping[str, str] = os.environ) -> bool:
    return environ.get(VERBOSE, "").strip().lower() not in ("", "0", "false", "no")


def quiet_tensorflow(environ: MutableMapping[str, str] = os.environ, *, verbose: bool = False) -> None:
    """Set TensorFlow's C++ log level to errors only in ``environ`` unless verbose or already set;
    ``verbose`` also marks ``environ`` verbose, so launched ranks and nested commands stay verbose."""
    if verbose:
        environ[VERBOSE] = "1"
    if not is_verbose(environ):
        environ.setdefault(TF_LOG_LEVEL, QUIET_LEVEL)
