"""One worker of a chaos run (``benchmarks/harness/chaos.py``): elastic digits training that faults on cue.

Every process appends what it does to the events file (one JSON line per
event): each (re)start of the elastic function with its rank, size and the
step it starts from, each commit, the fault, the final accuracy. The fault
strikes once per run (an exclusive marker file): at global step ``STEP`` the
worker on ``--victim-host`` (rank 0, for ``checkpoint``) SIGKILLs itself
(``kill``), takes its host's link ``--link`` down and carries on (``cut``: on
a namespace host, ``chaos_netns``; its peers see silence, not a reset, until
Gloo's timeout) or SIGSTOPs itself (``hang``: the stand-in for a cut where
there are no namespace hosts; the harness SIGKILLs it later) at ``POINT``:
``step`` (a random moment inside the step, while its peers wait in the step's
allreduce), ``commit`` (inside the commit's broadcast of host changes) or
``checkpoint`` (rank 0, after writing the checkpoint's temporary, before the
rename).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402  (after init)

HOST = os.environ.get("HOROVOD_HOSTNAME", "")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=Path, required=True)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--fault", help="KIND:POINT:STEP (none: an undisturbed run)")
    p.add_argument("--victim-host", default="127.0.0.1")
    p.add_argument("--link", default="hvb0", help="the host's network interface that a cut takes down")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--wait-for-rejoin", type=float, default=0.0, metavar="S",
                   help="after a fault, rank 0 waits up to S seconds at an epoch end for the lost host to rejoin")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class Events:
    """Appends JSON lines; each is one write(2) to an O_APPEND file, so processes never interleave them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.marker = path.with_suffix(".fault")

    def log(self, event: str, **fields: object) -> None:
        line = json.dumps({"t": time.time(), "event": event, "pid": os.getpid(), "host": HOST, **fields}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def claim_fault(self) -> bool:
        """True for the one process that strikes (a rejoining worker on the victim's host must not again)."""
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def faulted(self) -> bool:
        return self.marker.exists()


class Fault:
    def __init__(self, spec: str, victim_host: str, link: str, events: Events) -> None:
        self.kind, self.point, step = spec.split(":")
        self.step = int(step)
        self.victim_host, self.link = victim_host, link
        self.events = events

    def due(self, point: str, step: int) -> bool:
        victim = hvdk8s.is_chief() if point == "checkpoint" else HOST == self.victim_host
        return point == self.point and step >= self.step and victim and not self.events.faulted()

    def strike(self, step: int) -> None:
        if not self.events.claim_fault():
            return
        self.events.log("fault", kind=self.kind, point=self.point, step=step, rank=hvdk8s.rank())
        if self.kind == "cut":
            subprocess.run(["ip", "link", "set", self.link, "down"], check=True)
        else:
            os.kill(os.getpid(), signal.SIGKILL if self.kind == "kill" else signal.SIGSTOP)


class ChaosState(hvdk8s.elastic.KerasState):
    """Logs each commit, and strikes a ``commit`` fault inside the commit's check for host changes."""

    def __init__(self, model: keras.Model, events: Events, fault: Fault | None, step: Callable[[], int],
                 **kwargs: Any) -> None:
        self.events, self.fault, self.step = events, fault, step
        super().__init__(model, **kwargs)

    def save(self) -> None:
        super().save()
        self.events.log("commit", step=self.step())

    def check_host_updates(self) -> None:
        if self.fault and self.fault.due("commit", self.step()):
            self.fault.strike(self.step())
        super().check_host_updates()


class StrikeInStep(keras.callbacks.Callback):
    """Strikes at a random moment inside the due step (a timer thread: the step itself runs in TensorFlow)."""

    def __init__(self, fault: Fault, model: keras.Model) -> None:
        super().__init__()
        self.fault, self._model = fault, model

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        step = int(self._model.optimizer.iterations.numpy())
        if self.fault.due("step", step):
            threading.Timer(random.uniform(0.001, 0.02), self.fault.strike, args=(step,)).start()


class WaitForRejoin(keras.callbacks.Callback):
    """After a fault, hold rank 0 at epoch ends until the lost host is back (a job long enough to see it)."""

    def __init__(self, state: hvdk8s.elastic.KerasState, events: Events, seconds: float, size: int) -> None:
        super().__init__()
        self.state, self.events, self.seconds, self.size = state, events, seconds, size

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        deadline = time.monotonic() + self.seconds
        while self.events.faulted() and hvdk8s.size() < self.size and time.monotonic() < deadline:
            time.sleep(0.5)
            self.state.check_host_updates()  # raises HostsUpdatedInterrupt once the host is back


def main() -> None:
    args = parse_args()
    events = Events(args.events)
    keras.utils.set_random_seed(args.seed + hvdk8s.rank())
    (x_train, y_train), (x_test, y_test) = hvdk8s.data.load_digits()
    model = hvdk8s.models.cnn("cnn", input_shape=x_train.shape[1:])
    model.compile(optimizer=hvdk8s.DistributedOptimizer(keras.optimizers.SGD(0.02, momentum=0.9)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fault = Fault(args.fault, args.victim_host, args.link, events) if args.fault else None

    def step() -> int:
        return int(model.optimizer.iterations.numpy())

    state = ChaosState(model, events, fault, step, epoch=0, batch=0)

    model_save = model.save

    def striking_model_save(path: str, *a: object, **kw: object) -> None:
        model_save(path, *a, **kw)
        if fault and fault.due("checkpoint", step()):
            fault.strike(step())

    # Shadows the method on this one model: hvdk8s.Checkpoint's save_atomic calls model.save(temporary), then renames.
    setattr(model, "save", striking_model_save)
    callbacks = [
        # Keras's epoch stays global across rounds (fit from initial_epoch=state.epoch), so state.epoch is its
        # epoch + 1 and hvdk8s.Checkpoint numbers its files by the global epoch (see examples/train_digits.py)
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(state, "epoch", epoch + 1)),
        hvdk8s.elastic.UpdateBatchStateCallback(state),
        hvdk8s.elastic.CommitStateCallback(state),
        hvdk8s.Checkpoint(args.checkpoint_dir),
        WaitForRejoin(state, events, args.wait_for_rejoin, size=2),
    ]
    if fault:
        callbacks.append(StrikeInStep(fault, model))

    @hvdk8s.elastic.run
    def train(state: hvdk8s.elastic.KerasState) -> None:
        events.log("start", rank=hvdk8s.rank(), size=hvdk8s.size(), epoch=state.epoch, step=step())
        model.optimizer.learning_rate = 0.02 * hvdk8s.size()
        data = hvdk8s.data.from_arrays(x_train, y_train, 32, seed=args.seed)  # sharded for this size
        model.fit(data, initial_epoch=state.epoch, epochs=args.epochs, callbacks=callbacks, verbose=0)

    train(state)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvdk8s.is_chief():
        events.log("done", accuracy=float(accuracy), step=step(), size=hvdk8s.size(), hostname=socket.gethostname())


if __name__ == "__main__":
    main()
