"""A progress bar on rank 0 only, replacing Keras's per-rank display.

Keras's ``verbose`` is per process: N ranks print N interleaved bars of
rank-local numbers. This bar runs on rank 0 alone and shows the job's
throughput; the other ranks print nothing. Use it with ``verbose=0``.
Under mpirun or in a pod the output is a pipe, not a terminal: there each
refresh becomes its own log line, every ``mininterval`` seconds.
"""
from __future__ import annotations

import numbers
import sys
import time
from typing import TextIO

import keras
from tqdm import tqdm

from hvdk8s import runtime
from hvdk8s.observe.metrics import epoch_examples, loss_tracker
from hvdk8s.observe.ranklog import log_once
from hvdk8s.train import keras_compat


class _LineStream:
    """Writes each tqdm refresh as one line: in pipes and pod logs the carriage
    returns tqdm redraws with would pile every refresh into one huge line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self._stream.write(line + "\n")

    def flush(self) -> None:
        self._stream.flush()


class ProgressBar(keras.callbacks.Callback):
    """One tqdm bar per epoch on rank 0: steps, ETA, loss and job examples/s.

    During the epoch, examples/s is rank 0's rate times the number of ranks
    (ranks step in lockstep); at the epoch end the bar shows the epoch logs,
    rank-averaged by ``MetricAverageCallback`` and with the exact job throughput when
    ``TrainingMetrics`` runs before this callback. Pass ``verbose=0`` to
    ``model.fit`` on every rank, or Keras prints its own display as well.

    Args:
        batch_size: The per-rank batch size, needed only when a custom ``train_step`` bypasses Keras's loss
            tracker.
        file: Where the bar is written; None for standard error.
        mininterval: Seconds between refreshes; None for 0.1 s on a terminal, 10 s in logs (a pipe), where
            each refresh is its own line.
    """

    def __init__(
        self, *, batch_size: int | None = None, file: TextIO | None = None, mininterval: float | None = None
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.file = file
        self.mininterval = mininterval
        self._bar: tqdm | None = None
        self._call = keras_compat.CallSteps()
        self._start = self._postfix_at = 0.0

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._tracker = None if self.batch_size else loss_tracker(self.model)
        if runtime.is_chief() and self.params.get("verbose", 0) != 0:
            log_once(
                "ProgressBar replaces Keras's progress display: pass verbose=0 to model.fit",
                rank=runtime.rank(), local_rank=runtime.local_rank(),
            )

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if not runtime.is_chief():
            return
        stream = self.file or sys.stderr
        terminal = stream.isatty()
        self._bar = tqdm(
            total=self.params.get("steps"),
            desc=f"Epoch {epoch + 1}/{self.params.get('epochs')}",
            unit="step",
            file=stream if terminal else _LineStream(stream),
            mininterval=self.mininterval if self.mininterval is not None else (0.1 if terminal else 10.0),
            dynamic_ncols=terminal,
        )
        self._start = self._postfix_at = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._call.begin(batch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._bar is None:
            return
        done = self._call.done(self.model, self.params)
        now = time.perf_counter()
        if now - self._postfix_at >= self._bar.mininterval:
            # Reading the loss and the example count waits for TensorFlow: only when the bar will redraw.
            self._postfix_at = now
            postfix = {"loss": f"{float(logs['loss']):.4g}"} if logs and "loss" in logs else {}
            examples = epoch_examples(self._tracker, done, self.batch_size) * runtime.size()
            if examples and now > self._start:
                postfix["examples/s"] = f"{examples / (now - self._start):,.0f}"
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(done - self._bar.n)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._bar is None:
            return
        numeric = {k: v for k, v in (logs or {}).items() if isinstance(v, numbers.Real)}
        self._bar.set_postfix({k: f"{v:.4g}" for k, v in numeric.items()}, refresh=False)
        self._bar.close()
        self._bar = None
