"""Rank-0 checkpoints with atomic writes, and resume from the latest one.

A checkpoint is a whole ``.keras`` file (model, optimizer state, config), so
it loads with plain Keras. It is written under a hidden temporary name in the
same folder and renamed into place: a job killed mid-write leaves the previous
checkpoint intact and never a truncated file under a checkpoint name.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import keras

from hvdk8s import collectives, runtime

_NAME = re.compile(r"^ckpt-(\d{4,})\.keras$")


def checkpoint_path(directory: str | os.PathLike[str], epoch: int) -> Path:
    """Where the checkpoint taken after ``epoch`` completed epochs lives."""
    return Path(directory) / f"ckpt-{epoch:04d}.keras"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(epochs completed, path) of every checkpoint in ``directory``, oldest first."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), folder / m.group(0)) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def save_atomic(model: keras.Model, path: str | os.PathLike[str]) -> Path:
    """Save ``model`` to ``path`` through a temporary file and an atomic rename."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{os.getpid()}-{final.name}")
    try:
        model.save(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def restore_latest(model: keras.Model, directory: str | os.PathLike[str]) -> int:
    """Load the newest checkpoint into ``model`` on rank 0; return the epoch to resume at.

    Only rank 0 reads (workers need no access to its disk); every rank gets
    the epoch number, and ``BroadcastGlobalVariablesCallback`` then copies rank 0's
    weights and optimizer state to the others when training starts. The
    model must be compiled so its optimizer state can be restored.
    """
    epoch = 0
    if runtime.is_chief():
        checkpoints = list_checkpoints(directory)
        if checkpoints:
            epoch, path = checkpoints[-1]
            if model.optimizer is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            model.load_weights(path)
            print(f"hvdk8s: resumed from {path} (epoch {epoch})", flush=True)
    return int(collectives.broadcast_object(epoch, name="hvdk8s.resume_epoch"))


class Checkpoint(keras.callbacks.Callback):
    """Save a checkpoint on rank 0 every ``every_epochs`` epochs, keeping the last ``keep``."""

    def __init__(self, directory: str | os.PathLike[str], *, every_epochs: int = 1, keep: int = 3) -> None:
        super().__init__()
        if every_epochs < 1 or keep < 1:
            raise ValueError("Checkpoint: every_epochs and keep must be >= 1")
        self.directory = Path(directory)
        self.every_epochs = every_epochs
        self.keep = keep

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        done = epoch + 1
        if not runtime.is_chief() or done % self.every_epochs:
            return
        save_atomic(self.model, checkpoint_path(self.directory, done))
        for _, old in list_checkpoints(self.directory)[: -self.keep]:
            old.unlink(missing_ok=True)
