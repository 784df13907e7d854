"""Once-only, rank-aware log messages for conditions every rank would report.

Eight ranks on a host all find NVML failing to start; the user needs to read it once,
and to know which rank (or host) said it.
"""
from __future__ import annotations

import logging

logger = logging.getLogger("hvdk8s")
_said: set[str] = set()


def log_once(
    message: str, *, rank: int, local_rank: int, host_wide: bool = False, level: int = logging.WARNING
) -> None:
    """Log ``message`` at most once per process, prefixed with the rank.

    ``host_wide`` conditions (no NVML on this machine) are logged by local
    rank 0 only, so each host says it once.
    """
    if message in _said or (host_wide and local_rank != 0):
        return
    _said.add(message)
    logger.log(level, "hvdk8s[rank %d]: %s", rank, message)
