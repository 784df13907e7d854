"""``horovod.tensorflow.keras.elastic`` for Keras 3, on Horovod's elastic driver (``horovodrun --min-np/--max-np``).

Horovod's ``TensorFlowKerasState`` calls ``optimizer.variables()``, which is a
list in Keras 3, and its ``run`` only recognises failures whose message names
``HorovodAllreduce``/``Allgather``/``Broadcast``: a failed grouped allreduce, or
a Gloo error such as "Connection reset by peer" raised in a collective whose
node is named after the optimizer, never triggered a reset, and any other
``UnknownError`` was swallowed. This module keeps Horovod's names and driver
protocol (``ObjectState``, ``run_fn``) and fixes both: ``is_collective_failure``
decides by the error's type and by where the failing op was defined.
"""
from __future__ import annotations

import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import horovod.tensorflow as hvd
import horovod.tensorflow.mpi_ops
import keras
import numpy as np
import tensorflow as tf
from horovod.tensorflow.elastic import HorovodInternalError, ObjectState, run_fn

from hvdk8s import collectives
from hvdk8s.common import argcheck


class KerasState(ObjectState):
    """Model weights, optimizer state and any extra attributes (``epoch=0, batch=0``) kept in sync.

    ``commit()`` copies the variables to host memory and checks for host
    changes; after a worker is lost the survivors ``restore()`` the last
    commit, and ``sync()`` brings every rank to rank 0's state. A model that
    Keras builds during its first step (no ``Input``) may not be built on a
    worker that joins later: ``sync()`` builds it from rank 0's
    ``get_build_config()`` first, so the variable lists match. When no rank
    has built the model yet (a fresh start), the variables are broadcast after
    the first step instead, by ``CommitStateCallback`` (as Horovod's
    ``BroadcastGlobalVariablesCallback`` does for such models).

    Args:
        model: The model whose variables are kept in sync.
        optimizer: The optimizer whose variables are kept in sync; None takes ``model.optimizer``.
        **kwargs: Further state kept in sync, as attributes of the same names (``state.epoch``,
            ``state.batch``, ...), committed, restored and broadcast from rank 0 with the variables.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``, or ``optimizer`` is neither None nor a Keras optimizer.

    Example:
        ``run``'s example makes one and trains with it.
    """

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, **kwargs: Any) -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(f"model: expected a keras.Model, got {type(model).__name__} {model!r}")
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"optimizer: expected a keras.optimizers.Optimizer or None (the model's), "
                            f"got {type(optimizer).__name__} {optimizer!r}")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        self._saved: list[tuple[keras.Variable, np.ndarray]] = []
        self._variables_synced = False
        self._save_variables()
        super().__init__(bcast_object=collectives.broadcast_object, get_rank=hvd.rank, **kwargs)

    def _variables(self) -> list[keras.Variable]:
        optimizer_vars = list(self.optimizer.variables) if self.optimizer is not None and self.optimizer.built else []
        return list(self.model.variables) + optimizer_vars

    def _save_variables(self) -> None:
        variables = self._variables()
        self._saved = list(zip(variables, _read_all(variables)))

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for var, value in self._saved:
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        """Bring every rank to rank 0's state; a peer lost meanwhile resets again.

        Horovod's ``run_fn`` calls this outside the wrapped function, where only
        ``HorovodInternalError`` leads to a reset, so a failed collective here is raised as one.

        Raises:
            HorovodInternalError: A collective failed (a peer was lost): Horovod's driver resets.
        """
        with _failed_collectives_reset():
            build_config = collectives.broadcast_object(
                self.model.get_build_config() if self.model.built else None, name="hvdk8s.elastic.build"
            )
            self._variables_synced = False
            if build_config is not None:
                if not self.model.built:
                    self.model.build_from_config(build_config)
                self.sync_variables()
            self._save_variables()
            super().sync()

    def sync_variables(self) -> None:
        """Broadcast model and optimizer variables from rank 0 once per sync, when the model is built."""
        if self._variables_synced or not self.model.built:
            return
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        collectives.broadcast_variables(self._variables())
        self._variables_synced = True


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at each epoch end (Horovod's).

    A commit saves the state and checks for host changes, so workers that
    join or leave are taken in at the next commit. After the first step it
    also broadcasts the variables of a model that Keras built during that step.

    Args:
        state: The state to commit.
        batches_per_commit: Commit every this many batches (and at each epoch end).

    Raises:
        TypeError: ``batches_per_commit`` is not a whole number.
        ValueError: ``batches_per_commit`` is below 1.
    """

    def __init__(self, state: KerasState, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = argcheck.whole("batches_per_commit", batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same on every rank after a reset

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.sync_variables()  # a no-op unless the model was built by this first step
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch of the epoch, 0 at each epoch end (Horovod's).

    Horovod also shortens the first epoch after a reset by ``state.batch``
    steps through ``params["steps"]``; Keras 3's ``fit`` does not read that
    back, so here the interrupted epoch runs in full (``state.batch`` still
    tells where it was).

    Args:
        state: The state whose ``batch`` attribute is kept.
    """

    def __init__(self, state: KerasState) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the global number of finished epochs, across resets (Horovod's).

    It counts as Horovod's does: ``state.epoch`` at train begin plus the epochs
    this ``fit`` has finished, which is right for Horovod's rounds
    (``fit(epochs=N - state.epoch)``, Keras counting from 0). A round run as
    ``fit(initial_epoch=state.epoch, ...)`` (which keeps ``Checkpoint`` names
    and the warm-up global) would count the resumed epochs twice: set
    ``state.epoch = epoch + 1`` at each epoch end instead (see ``run``'s
    example).

    Args:
        state: The state whose ``epoch`` attribute is kept.
    """

    def __init__(self, state: KerasState) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1


def _read_all(variables: list[keras.Variable]) -> list[np.ndarray]:
    """Host copies of ``variables`` from one compiled call (a commit may run every batch)."""
    if not variables:
        return []
    values = _snapshot([v.value for v in variables])
    return [np.array(t) for t in values]


@tf.function(reduce_retracing=True)
def _snapshot(variables: list[tf.Variable]) -> list[tf.Tensor]:
    return [tf.identity(v) for v in variables]


# Horovod's Python op wrappers: an op defined in a frame of these files is one of its collectives.
_HOROVOD_OPS = os.path.dirname(os.path.abspath(horovod.tensorflow.mpi_ops.__file__)) + os.sep
# The statuses of a collective that failed in transport (Horovod v0.28.1): horovod/common/operations.cc turns
# any exception of Gloo or MPI (a reset connection, a timeout, a vanished peer) into UNKNOWN_ERROR, and so is
# SHUT_DOWN_ERROR, the status of every pending op once the background loop has died; a removed process set
# gives ABORTED (process_set.h). horovod/tensorflow/mpi_ops.cc ConvertStatus maps them to TensorFlow's
# UnknownError and AbortedError. Its PRECONDITION_ERROR and INVALID_ARGUMENT (mismatched shapes, types or
# names across ranks) are mistakes in the script: resetting would only repeat them.
_TRANSPORT_FAILURES = (tf.errors.UnknownError, tf.errors.AbortedError)
# TensorFlow's account of a failed node in a tf.function (atomic_function.InterpolateRuntimeError): where the
# node was defined, one ``traceback.format_list`` entry per frame, outermost first.
_DEFINED_AT = re.compile(r"^Detected at node .* defined at \(most recent call last\):$")
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in ')
# The tags TensorFlow puts around an op's status: the function and node that ran it, the eager op's type.
_TF_TAGS = re.compile(r"\{\{function_node [^}]*\}\}|\[\[\{\{node [^}]*\}\}\]\]|\[Op:[^\]]*\](?: name: \S*)?")


def is_collective_failure(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) is a failed Horovod collective: a reset, not a bug.

    Decided by the error's type and by where the failing op was defined (the
    innermost frame of TensorFlow's node definition stack for an op in a
    tf.function, of the Python traceback for an op run eagerly): never by
    words in the message, which for a Gloo error is Gloo's own text.

    Args:
        err: The error raised; its ``__cause__`` and ``__context__`` chain is followed.

    Returns:
        True for ``HorovodInternalError``, and for TensorFlow's ``UnknownError`` or ``AbortedError`` raised
        by an op that Horovod defined.
    """
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, HorovodInternalError):
            return True
        if isinstance(link, _TRANSPORT_FAILURES) and _defined_by_horovod(link):
            return True
        link = link.__cause__ or link.__context__
    return False


def _defined_by_horovod(err: tf.errors.OpError) -> bool:
    stacks = _node_definition_stacks(err.message)
    stacks.append([frame.filename for frame in traceback.extract_tb(err.__traceback__)])
    return any(_innermost_file(files).startswith(_HOROVOD_OPS) for files in stacks)


def _node_definition_stacks(message: str) -> list[list[str]]:
    """The files of each failed node's definition stack in a tf.function error message, outermost first."""
    stacks: list[list[str]] = []
    for line in message.splitlines():
        if _DEFINED_AT.match(line):
            stacks.append([])
        elif stacks and (frame := _FRAME.match(line)):
            stacks[-1].append(frame.group("file"))
    return stacks


def _innermost_file(files: list[str]) -> str:
    """The innermost frame's file, skipping the op wrappers TensorFlow generates (file ``<string>``)."""
    real = [os.path.abspath(f) for f in files if not f.startswith("<")]
    return real[-1] if real else ""


@contextmanager
def _failed_collectives_reset() -> Iterator[None]:
    """Turn a failed collective into ``HorovodInternalError`` (reset and restore); let anything else through."""
    try:
        yield
    except HorovodInternalError:
        raise
    except Exception as err:
        if not is_collective_failure(err):
            raise
        summary = f"{type(err).__name__}: {_status_text(str(err))}"
        print(f"hvdk8s.elastic: a collective failed ({summary}); resetting to the last commit",
              file=sys.stderr, flush=True)
        raise HorovodInternalError(summary) from err


def _status_text(message: str) -> str:
    """The failed op's own status (Horovod's or Gloo's text), without TensorFlow's annotations around it."""
    texts = [text for line in message.splitlines() if (text := _TF_TAGS.sub("", line).strip())]
    return texts[-1] if texts else ""


def _reset() -> None:
    hvd.shutdown()
    hvd.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``func(state, ...)`` again, from the last commit, whenever workers change or a
    collective fails; any other error ends the job.

    Horovod's ``hvd.elastic.run``, with failed collectives recognised by ``is_collective_failure``.

    Args:
        func: The training function; its first argument is the ``KerasState``.

    Returns:
        The function to call as ``func`` would be, with the state first.

    Example:
        ```python
        state = hvd.elastic.KerasState(model, epoch=0, batch=0)
        callbacks = [  # Keras's epoch stays global across rounds (fit's initial_epoch below)
            keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(state, "epoch", epoch + 1)),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.CommitStateCallback(state),
        ]

        @hvd.elastic.run
        def train(state):
            model.fit(dataset, initial_epoch=state.epoch, epochs=12, callbacks=callbacks)

        train(state)
        ```
    """

    @functools.wraps(func)
    def wrapper(state: KerasState, *args: Any, **kwargs: Any) -> Any:
        with _failed_collectives_reset():
            return func(state, *args, **kwargs)

    return run_fn(wrapper, _reset)
