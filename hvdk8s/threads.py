"""CPU ranks' TensorFlow thread pools: the policies ``hvdk8s.init`` chooses from (``HVDK8S_THREAD_POLICY``).

Pure data and arithmetic, importable without TensorFlow (the benchmarks' knobs name the policies);
``hvdk8s.runtime`` applies the result. ``hvdk8s bench --knobs threads_*`` measures the policies
against each other (benchmarks/config/knobs.py).
"""
from __future__ import annotations

# None in a pool below: TensorFlow's own default for it (as many threads as the process may use cores).
THREAD_POLICIES: dict[str, str] = {
    "tf": "TensorFlow's defaults: intra- and inter-op pools as large as the cores, in every rank",
    "split": "cores / local_size intra-op threads per rank, at most 2 inter-op",
    "split-intra": "cores / local_size intra-op threads per rank, TensorFlow's default inter-op pool",
    "split+1": "cores / local_size + 1 intra-op threads per rank (oversubscribed by one), at most 2 inter-op",
}
DEFAULT_CPU_THREAD_POLICY = "split-intra"  # why: hvdk8s.runtime.init; measured: benchmarks/reports/threads


def thread_pools(policy: str, cores: int, local_size: int, override: int = 0) -> tuple[int | None, int | None]:
    """(intra-op, inter-op) threads of one CPU rank under ``policy`` (``THREAD_POLICIES``); None leaves TensorFlow's
    default. ``override`` (``threads_per_rank`` or ``HVDK8S_THREADS_PER_RANK``), when > 0, is the intra-op count
    and the inter-op pool is then ``split``'s, whatever the policy."""
    if policy not in THREAD_POLICIES:
        raise ValueError(f"HVDK8S_THREAD_POLICY={policy!r}: expected one of {', '.join(THREAD_POLICIES)}")
    share = max(1, cores // max(1, local_size))
    if override > 0:
        return override, max(1, min(2, override))
    if policy == "tf":
        return None, None
    if policy == "split-intra":
        return share, None
    intra = share + 1 if policy == "split+1" else share
    return intra, max(1, min(2, share))
