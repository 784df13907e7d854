"""Rank-0 checkpoints with atomic writes, and resume from the latest one.

A checkpoint is a whole ``.keras`` file (model, optimizer state, config), so
it loads with plain Keras. It is written under a hidden temporary name in the
same folder and renamed into place: a job killed mid-write leaves the previous
checkpoint intact and never a truncated file under a checkpoint name. The
temporary it leaves behind names its writer (host and process id), so the next
run removes it once that writer is gone.
"""
from __future__ import annotations

import os
import re
import socket
import time
import warnings
from pathlib import Path

import keras

from hvdk8s import collectives, runtime
from hvdk8s.common.argcheck import whole
from hvdk8s.common.atomic import atomic_path

_NAME = re.compile(r"^ckpt-(\d{4,})\.keras$")
# save_atomic's temporary of a checkpoint; older versions wrote it without the host.
_TEMPORARY = re.compile(r"^\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)-ckpt-\d{4,}\.keras$")
# A temporary written on another host (a rank 0 whose pod was replaced) is taken for abandoned once it has not
# been written to for this long: its writer cannot be asked, and a live save writes to it all along.
ABANDONED_AFTER_S = 3600.0


def checkpoint_path(directory: str | os.PathLike[str], epoch: int) -> Path:
    """Where the checkpoint taken after ``epoch`` completed epochs lives.

    Args:
        directory: The checkpoint folder.
        epoch: Epochs completed when the checkpoint was taken.

    Returns:
        ``directory/ckpt-<epoch, 4 digits or more>.keras``.
    """
    return Path(directory) / f"ckpt-{epoch:04d}.keras"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Every checkpoint in ``directory``, oldest first.

    Args:
        directory: The checkpoint folder; a missing one holds none.

    Returns:
        ``(epochs completed, path)`` of each ``ckpt-NNNN.keras`` file, by epoch.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), folder / m.group(0)) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def temporary_path(final: Path) -> Path:
    """Where ``save_atomic`` writes ``final`` before renaming it: hidden, and named after its writer.

    Args:
        final: The checkpoint's own path.

    Returns:
        ``.tmp-<host>-<pid>-<name>`` in the same folder.
    """
    return final.with_name(f".tmp-{socket.gethostname()}-{os.getpid()}-{final.name}")


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of checkpoint writes that will never finish (their writer was killed); return them.

    Stale: written on this host by a process that is no longer running, or on
    another host and untouched for ``ABANDONED_AFTER_S``. A temporary that a
    live writer is still filling is left alone.

    Args:
        directory: The checkpoint folder; a missing one holds none.

    Returns:
        The temporaries removed.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    host, now, removed = socket.gethostname(), time.time(), []
    for path in folder.iterdir():
        if not (match := _TEMPORARY.match(path.name)):
            continue
        try:
            if match.group("host") == host:
                stale = not _running(int(match.group("pid")))
            else:
                stale = now - path.stat().st_mtime > ABANDONED_AFTER_S
            if stale:
                path.unlink()
                removed.append(path)
        except FileNotFoundError:  # its writer renamed it into place meanwhile
            continue
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def save_atomic(model: keras.Model, path: str | os.PathLike[str]) -> Path:
    """Save ``model`` to ``path`` through a temporary file and an atomic rename.

    A process killed mid-write leaves whatever was at ``path`` before, never a
    truncated file. It saves in the calling process only: call it on rank 0.

    Args:
        model: The model to save (``model.save``: model, optimizer state, config).
        path: The ``.keras`` file to write.

    Returns:
        ``path``, as a ``Path``.
    """
    final = Path(path)
    with atomic_path(final, temporary=temporary_path(final).name) as tmp:
        model.save(tmp)
    return final


def restore_latest(model: keras.Model, directory: str | os.PathLike[str]) -> int:
    """Load the newest checkpoint into ``model`` on rank 0; return the epoch to resume at.

    Only rank 0 reads (workers need no access to its disk); every rank gets
    the epoch number, and ``BroadcastGlobalVariablesCallback`` then copies rank 0's
    weights and optimizer state to the others when training starts. The
    model must be compiled so its optimizer state can be restored. Rank 0
    first removes the temporaries that killed writes left behind. A collective:
    call it on every rank.

    Args:
        model: The compiled model to load the weights and optimizer state into.
        directory: The checkpoint folder (``Checkpoint``'s); a missing or empty one means a fresh start.

    Returns:
        The number of epochs the newest checkpoint had completed (0 when there is none): pass it to
        ``fit(initial_epoch=...)``.

    Raises:
        ValueError: ``directory`` is a file, or its newest checkpoint does not fit ``model`` (``load_latest``,
            on rank 0, which tells every rank).

    Example:
        ```python
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size())), loss=...)
        start = hvd.restore_latest(model, "checkpoints")
        model.fit(dataset, epochs=20, initial_epoch=start,
                  callbacks=hvd.default_callbacks(checkpoint_dir="checkpoints"))
        ```
    """
    epoch, refused = 0, None
    if runtime.is_chief():
        try:
            epoch = load_latest(model, directory)
        except ValueError as err:  # said on every rank, not only where it was found while the others wait
            refused = err
    epoch, problem = collectives.broadcast_object((epoch, refused and str(refused)), name="hvdk8s.resume_epoch")
    if refused:
        raise refused
    if problem:
        raise ValueError(problem)
    return int(epoch)


def load_latest(model: keras.Model, directory: str | os.PathLike[str]) -> int:
    """Load the newest checkpoint into ``model`` in this process alone; return its epoch (0: none yet).

    No collective: an elastic job's rank 0 calls it where a worker joining the
    running job would otherwise meet it with the running ranks' state sync
    (``KerasState.sync`` then brings every rank to rank 0's weights and epoch).
    Stale temporaries are removed first.

    Args:
        model: The compiled model to load the weights and optimizer state into.
        directory: The checkpoint folder; a missing or empty one means a fresh start.

    Returns:
        The number of epochs the newest checkpoint had completed, 0 when there is none.

    Raises:
        ValueError: ``directory`` is a file (a checkpoint itself, say), or its newest checkpoint does not fit
            ``model`` (another architecture): the message names the file and keeps Keras's first line.
    """
    folder = Path(directory)
    if folder.is_file():
        raise ValueError(f"checkpoint folder {folder}: is a file; expected the folder holding the ckpt-NNNN.keras "
                         f"checkpoints (Checkpoint's directory), such as {folder.parent}")
    remove_stale_temporaries(folder)
    checkpoints = list_checkpoints(folder)
    if not checkpoints:
        return 0
    epoch, path = checkpoints[-1]
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    try:
        model.load_weights(path)
    except ValueError as err:  # Keras's "A total of N objects could not be loaded..." names no file
        first_line = str(err).partition("\n")[0]
        raise ValueError(f"checkpoint {path.name} in {folder}: does not fit the model (saved from another "
                         f"architecture?); Keras: {first_line}") from err
    print(f"hvdk8s: resumed from {path} (epoch {epoch})", flush=True)
    return epoch


class Checkpoint(keras.callbacks.Callback):
    """Save a checkpoint on rank 0 every ``every_epochs`` epochs, keeping the last ``keep``.

    Keras's ``epoch`` names the checkpoint, so ``fit`` must count it globally
    (``initial_epoch=`` the epoch resumed at, also in each elastic round).
    Where a newer checkpoint is already in the folder, the one written now
    sorts before it, is pruned first and is never resumed: that warns, once
    per ``fit``. It may be in every rank's list: only rank 0 writes; at train begin
    rank 0 removes the temporaries of writes that were killed.

    Args:
        directory: The checkpoint folder, created when needed.
        every_epochs: Save after every this many epochs (counted by Keras's ``epoch`` + 1).
        keep: How many of the newest checkpoints to keep; older ones are deleted.

    Raises:
        TypeError: ``every_epochs`` or ``keep`` is not a whole number.
        ValueError: ``every_epochs`` or ``keep`` is below 1.

    Example:
        ```python
        start = hvd.restore_latest(model, "checkpoints")
        model.fit(dataset, epochs=20, initial_epoch=start,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.MetricAverageCallback(),
                             hvd.Checkpoint("checkpoints", every_epochs=2, keep=3)])
        ```
    """

    def __init__(self, directory: str | os.PathLike[str], *, every_epochs: int = 1, keep: int = 3) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.every_epochs = whole("every_epochs", every_epochs)
        self.keep = whole("keep", keep)
        self._warned = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._warned = False
        if runtime.is_chief():
            remove_stale_temporaries(self.directory)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        done = epoch + 1
        if not runtime.is_chief() or done % self.every_epochs:
            return
        path = checkpoint_path(self.directory, done)
        existing = list_checkpoints(self.directory)
        if existing and existing[-1][0] > done and not self._warned:
            self._warned = True
            warnings.warn(
                f"hvdk8s.Checkpoint: {self.directory} already holds {existing[-1][1].name}, newer than the "
                f"{path.name} written now, which sorts before it: pruning removes it first and a resume never "
                "reads it. This fit's epochs do not count the earlier ones: pass fit(initial_epoch=) the epoch "
                "resumed at (in every elastic round too), or use an empty folder", stacklevel=2,
            )
        save_atomic(self.model, path)
        for _, old in list_checkpoints(self.directory)[: -self.keep]:
            old.unlink(missing_ok=True)
