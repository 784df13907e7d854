"""Horovod, Open MPI and software-stack settings the knob study measures, each against the suite's defaults.

A knob is an environment (``HOROVOD_*``), Open MPI MCA parameters and/or the
Python interpreter (another virtual environment: another TensorFlow/Keras
stack) applied to one mpirun launch of the paired hvdk8s/raw-loop training
worker at N=2; every round runs the baseline and every knob back to back, so
each knob's effect is a ratio to the baseline of its own round, and each
launch has its own hvdk8s/raw-loop ratio. Pure data: whether an interpreter
exists and what it runs is found out by ``launch`` (``suite.check_stacks``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hvdk8s.launcher.mpirun import transport_mca
from hvdk8s.threads import THREAD_POLICIES


@dataclass(frozen=True)
class Knob:
    """``python``: the interpreter its ranks run, relative to the repository root (or absolute);
    "" is the one running the suite. ``build``: the command that makes that interpreter.
    ``thread_policy``: the ranks get no thread count from the suite and run ``hvdk8s.init``'s
    ``HVDK8S_THREAD_POLICY`` of that name (``hvdk8s.threads.THREAD_POLICIES``) instead."""

    env: dict[str, str] = field(default_factory=dict)
    mca: dict[str, str] = field(default_factory=dict)
    what: str = ""
    python: str = ""
    build: str = ""
    thread_policy: str = ""


BASELINE = "baseline"


def stack(tf: str, keras: str) -> Knob:
    """The supported stack ``make test-stack TF=<tf>`` builds in ``.venv-tf<tf>`` (scripts/stacks/tf-<tf>.txt)."""
    venv = f".venv-tf{tf}"
    return Knob(python=f"{venv}/bin/python", build=f"make test-stack TF={tf}",
                what=f"TensorFlow {tf} / Keras {keras} stack: the ranks run {venv}/bin/python")


def threads(policy: str, spin: bool = False) -> Knob:
    """A CPU thread policy of ``hvdk8s.init`` (ranks yielding when idle, as the baseline, or busy-polling)."""
    return Knob({"HVDK8S_THREAD_POLICY": policy}, mca={"mpi_yield_when_idle": "0"} if spin else {}, thread_policy=policy,
                what=f"thread policy {policy}: {THREAD_POLICIES[policy]}; "
                     + ("ranks busy-poll while waiting (mpi_yield_when_idle 0)" if spin else "ranks yield when idle"))


THREAD_KNOBS = {f"threads_{p}{'_spin' if spin else ''}": threads(p, spin) for p in THREAD_POLICIES for spin in (False, True)}

KNOBS: dict[str, Knob] = {
    BASELINE: Knob(what="the suite's settings: Horovod's defaults (1 ms cycle, 128 MiB fusion buffer, cache of 1024), "
                        "Open MPI picks the allreduce algorithm, ranks yield when idle, TCP eager limit 16 MiB"),
    "cycle_0.1ms": Knob({"HOROVOD_CYCLE_TIME": "0.1"}, what="Horovod's background loop wakes every 0.1 ms instead of 1 ms"),
    "cycle_5ms": Knob({"HOROVOD_CYCLE_TIME": "5"}, what="background loop every 5 ms (Horovod's default before 0.21)"),
    "fusion_4MiB": Knob({"HOROVOD_FUSION_THRESHOLD": str(4 << 20)}, what="fusion buffer 4 MiB instead of 128 MiB"),
    "fusion_off": Knob({"HOROVOD_FUSION_THRESHOLD": "0"}, what="no tensor fusion: one MPI allreduce per tensor"),
    "cache_off": Knob({"HOROVOD_CACHE_CAPACITY": "0"}, what="response cache off: every tensor is negotiated every step"),
    "autotune": Knob({"HOROVOD_AUTOTUNE": "1"}, what="Horovod's Bayesian autotuner (cycle time, fusion size, cache) during the run"),
    "ompi_ring": Knob(
        mca=transport_mca("ring"), what="Open MPI's ring allreduce forced (the suite forced it before this study)"
    ),
    "ompi_recursive_doubling": Knob(
        mca=transport_mca("recursive_doubling"),
        what="Open MPI's recursive-doubling allreduce (openMpi.allreduceAlgorithm: recursive_doubling)",
    ),
    "ompi_spin": Knob(mca={"mpi_yield_when_idle": "0"}, what="ranks busy-poll while waiting (Open MPI's default)"),
    **THREAD_KNOBS,
    # Every supported stack but the default one (.venv's, the baseline's when the suite runs from .venv).
    "tf2.18": stack("2.18", "3.8"),
    "tf2.19": stack("2.19", "3.15"),
    "tf2.20": stack("2.20", "3.15"),
}


def names() -> tuple[str, ...]:
    """Every knob but the baseline, in study order."""
    return tuple(k for k in KNOBS if k != BASELINE)


def stacks() -> tuple[str, ...]:
    """The knobs that run another interpreter: named one by one, never part of ``all``."""
    return tuple(k for k in names() if KNOBS[k].python)


def settings_names() -> tuple[str, ...]:
    """``--knobs all``: every Horovod/Open MPI knob, on the suite's own interpreter (no other
    virtual environment needed; the stack knobs are named explicitly)."""
    return tuple(k for k in names() if not KNOBS[k].python)
