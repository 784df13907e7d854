"""Prometheus metrics from every rank of a training job.

Each rank serves its own endpoint on ``HVDK8S_METRICS_PORT + local_rank``
(base 9090), so a dead or slow rank shows up as its own target rather than
vanishing into an average. Rank 0 also serves the job-wide figures, which the
ranks exchange in one small allreduce at each epoch end; the per-rank series
remain for PromQL (``sum by (job) (hvdk8s_examples_per_second)``).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import keras
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hvdk8s import collectives, commtime, runtime
from hvdk8s.common.errors import UserError
from hvdk8s.observe import telemetry
from hvdk8s.observe.ranklog import log_once
from hvdk8s.train import keras_compat

DEFAULT_PORT = 9090
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))

# Job-wide epoch figures on rank 0: hvdk8s_job_<key>.
JOB_METRICS: Mapping[str, str] = {
    "examples_per_second": "Training examples per second of the whole job in the last epoch (sum over ranks).",
    "step_seconds": "Wall time per step in the last epoch, mean over ranks.",
    "allreduce_seconds": "Gradient communication per step left exposed after backprop in the last epoch, "
    "mean over ranks.",
    "loss": "Training loss of the last epoch, mean over ranks.",
    "ranks": "Number of ranks in the job.",
}
EPOCH_FIGURES = ("examples_per_second", "step_seconds", "allreduce_seconds")  # the job series from epoch logs


def metrics_port(environ: Mapping[str, str], local_rank: int, port: int | None = None) -> int:
    """The port this rank listens on: base + local_rank, or 0 (any free port) when the base is 0.

    The base is ``port`` or else ``HVDK8S_METRICS_PORT`` (default 9090), the
    variable the MPIJob manifests set next to the containers' metric ports.
    """
    if port is None:
        raw = environ.get("HVDK8S_METRICS_PORT", str(DEFAULT_PORT))
        if not raw.strip().isdigit():
            raise UserError(f"HVDK8S_METRICS_PORT={raw!r}: expected a port number (0 for any free port)")
        port = int(raw)
    if port == 0:
        return 0
    if not 0 < port + local_rank <= 65535:
        raise UserError(f"metrics port {port} + local rank {local_rank}: outside 1-65535")
    return port + local_rank


def rank_labels(environ: Mapping[str, str], rank: int, local_rank: int) -> dict[str, str]:
    """Labels on every series of this rank; ``HVDK8S_JOB_NAME`` is set by the MPIJob manifests."""
    return {
        "job": environ.get("HVDK8S_JOB_NAME", "hvdk8s"),
        "rank": str(rank),
        "local_rank": str(local_rank),
        "host": socket.gethostname(),
    }


class Exporter:
    """One process's metrics: a private registry, its series and (once served) its port."""

    def __init__(self, labels: Mapping[str, str], *, chief: bool) -> None:
        self.registry = CollectorRegistry()
        self.port: int | None = None

        def series(kind: Callable[..., Any], name: str, doc: str, **kwargs: Any) -> Any:
            return kind(name, doc, list(labels), registry=self.registry, **kwargs).labels(**labels)

        self.examples = series(Counter, "hvdk8s_examples", "Training examples this rank has processed.")
        self.steps = series(Counter, "hvdk8s_steps", "Training steps this rank has run.")
        self.examples_per_second = series(
            Gauge, "hvdk8s_examples_per_second", "This rank's training examples per second over its last steps."
        )
        self.step_seconds = series(
            Histogram, "hvdk8s_step_seconds", "Wall time per training step, input pipeline and callbacks included.",
            buckets=STEP_BUCKETS,
        )
        self.allreduce_seconds = series(
            Histogram, "hvdk8s_allreduce_seconds",
            "Gradient communication per training step left exposed after backprop: from the last gradient "
            "to the last reduced gradient (allreduces that overlap backprop cost nothing here).",
            buckets=STEP_BUCKETS,
        )
        self.loss = series(Gauge, "hvdk8s_loss", "This rank's running mean training loss in the current epoch.")
        self.epoch = series(Gauge, "hvdk8s_epoch", "Current epoch, counted from 1 as Keras prints it.")
        self.epochs = series(Gauge, "hvdk8s_epochs", "Epochs the training run is set to reach.")
        self.last_step = series(
            Gauge, "hvdk8s_last_step_timestamp_seconds",
            "Unix time this rank last finished a step (a stalled rank stops advancing).",
        )
        self.job = {
            key: Gauge(f"hvdk8s_job_{key}", doc, ["job"], registry=self.registry).labels(job=labels["job"])
            for key, doc in JOB_METRICS.items()
        } if chief else {}

    def serve(self, port: int, say: Callable[[str], None]) -> None:
        """Start the HTTP endpoint; a busy port is reported, never raised: training matters more."""
        try:
            server, _thread = start_http_server(port, registry=self.registry)
        except OSError as err:
            say(f"metrics endpoint off: cannot listen on port {port} ({err.strerror}); training goes on")
            return
        self.port = server.server_port

    def set_job(self, values: Mapping[str, float]) -> None:
        """Publish job-wide figures (rank 0 only; a no-op elsewhere)."""
        for key, gauge in self.job.items():
            if key in values:
                gauge.set(values[key])


_exporter: Exporter | None = None


def exporter(port: int | None = None) -> Exporter:
    """This process's exporter, created and served on first call (``port`` as in ``metrics_port``).

    One per process because the endpoint is: a second ``fit`` or a second
    callback list reuses it instead of failing on its own port.
    """
    global _exporter
    if _exporter is None:
        rank, local_rank = runtime.rank(), runtime.local_rank()
        say = partial(log_once, rank=rank, local_rank=local_rank)
        labels = rank_labels(os.environ, rank, local_rank)
        created = Exporter(labels, chief=runtime.is_chief())
        gpu = telemetry.gpu_telemetry(
            labels, rank=rank, local_rank=local_rank, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        if gpu is not None:
            created.registry.register(gpu)
        created.serve(metrics_port(os.environ, local_rank, port), say)
        if created.port is not None:
            say(f"serving Prometheus metrics on port {created.port}", level=logging.INFO)
        _exporter = created
    return _exporter


def loss_tracker(model: keras.Model) -> keras.metrics.Metric | None:
    """The model's ``loss`` metric, which counts samples (``keras_compat.loss_tracker``).

    ``fit`` resets it each epoch and the built-in ``train_step`` adds each
    batch's size (partial batches exact). It is fixed for a whole ``fit``, so
    callbacks look it up once: ``model.metrics`` walks every layer.
    """
    return keras_compat.loss_tracker(model)


def epoch_examples(tracker: keras.metrics.Metric | None, steps: int, batch_size: int | None) -> int:
    """Examples this rank has trained on in the current epoch: ``steps × batch_size``, else the tracker's count."""
    if batch_size:
        return steps * batch_size
    return keras_compat.examples_counted(tracker) if tracker is not None else 0


class TrainingMetrics(keras.callbacks.Callback):
    """Export this rank's progress to Prometheus, and the job's on rank 0.

    Per step, in plain Python (no TensorFlow read, so nothing waits for the
    device): steps and wall time per step (end to end, so input stalls count).
    Every ``sample_seconds`` and at each epoch end it reads the TensorFlow
    side once: examples (Keras's loss tracker), the gradient communication
    left exposed after backprop (``hvdk8s.commtime``) and the running loss,
    and derives examples/s over the last ``window`` samples. At each epoch end
    the ranks average their epoch figures in one allreduce, so this callback
    must be in every rank's list; the job figures also go into the epoch logs
    (``examples_per_second``, ``step_seconds``, ``allreduce_seconds``) for
    TensorBoard, the progress bar and History. Place it after
    ``MetricAverageCallback`` so the loss it reports is the job's; handed to
    its ``add_figures`` (``observability_callbacks(metric_average=...)``
    does), ``figures_for_average`` puts the figures into that callback's
    allreduce instead of a second one. The endpoint serves from the first
    ``on_train_begin`` on, once per process; a busy port is reported, and
    training goes on without it.

    Args:
        port: Base metrics port (rank serves on base + local rank); None reads ``HVDK8S_METRICS_PORT``
            (default 9090), 0 picks a free port per rank.
        batch_size: The per-rank batch size, needed only when a custom ``train_step`` bypasses Keras's loss
            tracker (examples are then counted as steps × batch size).
        window: Number of recent samples examples/s is computed over.
        sample_seconds: How often, at most, the TensorFlow-side counters are read during an epoch.

    Raises:
        UserError: When training begins, ``HVDK8S_METRICS_PORT`` is not a number, or the port plus the
            local rank is outside 1-65535.
    """

    def __init__(
        self, *, port: int | None = None, batch_size: int | None = None, window: int = 20, sample_seconds: float = 1.0
    ) -> None:
        super().__init__()
        self.port = port
        self.batch_size = batch_size
        self.sample_seconds = sample_seconds
        self._exporter: Exporter | None = None
        self._recent: deque[tuple[float, int]] = deque(maxlen=window)
        self._epoch_start: float | None = None
        self._last_end = 0.0
        self._steps = 0
        self._call = keras_compat.CallSteps()
        self._sample = _Sample()
        self._allreduce_epoch = 0.0
        self._figures_in_logs = False

    @property
    def exporter(self) -> Exporter:
        """The process's exporter, from ``on_train_begin`` on."""
        if self._exporter is None:
            raise RuntimeError("TrainingMetrics: the exporter starts with training (on_train_begin)")
        return self._exporter

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._exporter = exporter(self.port)
        self._tracker = None if self.batch_size else loss_tracker(self.model)
        self.exporter.epochs.set(float(self.params.get("epochs") or 0))
        self.exporter.set_job({"ranks": float(runtime.size())})

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.exporter.epoch.set(epoch + 1)
        self._epoch_start = None
        self._figures_in_logs = False
        self._steps = 0
        self._allreduce_epoch = commtime.read()[0]
        self._sample = _Sample(allreduce=self._allreduce_epoch)
        self._recent.clear()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._call.begin(batch)
        if self._epoch_start is None:
            self._epoch_start = self._last_end = self._sample.time = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        seconds, self._last_end = now - self._last_end, now
        done = self._call.done(self.model, self.params)
        steps, self._steps = done - self._steps, done
        exp = self.exporter
        exp.steps.inc(steps)
        for _ in range(steps):
            exp.step_seconds.observe(seconds / steps)
        exp.last_step.set_to_current_time()
        if now - self._sample.time >= self.sample_seconds:
            self._take_sample(now, logs)

    def _take_sample(self, now: float, logs: dict | None) -> None:
        """Read the TensorFlow-side counters once and publish what they imply since the last sample."""
        examples = epoch_examples(self._tracker, self._steps, self.batch_size)
        allreduce = commtime.read()[0]
        last, self._sample = self._sample, _Sample(now, self._steps, examples, allreduce)
        steps, new_examples = self._steps - last.steps, examples - last.examples
        if examples == 0 and self._steps:
            log_once(
                "examples/s unknown: this model's train_step does not count samples in Keras's loss tracker; "
                "pass batch_size= to the observability callbacks",
                rank=runtime.rank(), local_rank=runtime.local_rank(),
            )
        exp = self.exporter
        exp.examples.inc(new_examples)
        for _ in range(steps):
            exp.allreduce_seconds.observe((allreduce - last.allreduce) / steps)
        self._recent.append((now - last.time, new_examples))
        window_seconds = sum(s for s, _ in self._recent)
        exp.examples_per_second.set(sum(n for _, n in self._recent) / window_seconds if window_seconds else 0.0)
        if logs and "loss" in logs:
            exp.loss.set(float(logs["loss"]))

    def figures_for_average(self) -> dict[str, float]:
        """This epoch's figures for ``MetricAverageCallback.add_figures``, which averages them into the logs.

        ``on_epoch_end`` then reads the job figures back from the logs
        instead of making an allreduce of its own.

        Returns:
            This rank's ``examples_per_second`` (scaled by the job size), ``step_seconds`` and
            ``allreduce_seconds`` for the epoch; zeros outside a ``fit``.
        """
        self._figures_in_logs = True
        return self._epoch_figures()

    def _epoch_figures(self) -> dict[str, float]:
        """This rank's figures for the epoch that just ended; their mean over ranks is the job's.

        Examples/s is scaled by the job size, so the mean is the job's sum. A
        rank that ran no batch this epoch (or a callback not in this ``fit``)
        gives zeros, so every rank reduces the same tensors.
        """
        if self._epoch_start is None:
            return dict.fromkeys(EPOCH_FIGURES, 0.0)
        self._take_sample(self._last_end, None)
        seconds = self._last_end - self._epoch_start
        steps = max(self._steps, 1)
        return {
            "examples_per_second": self._sample.examples / seconds * runtime.size() if seconds else 0.0,
            "step_seconds": seconds / steps,
            "allreduce_seconds": (self._sample.allreduce - self._allreduce_epoch) / steps,
        }

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._figures_in_logs and logs is not None:  # MetricAverageCallback averaged them with the logs
            job = {k: float(logs[k]) for k in EPOCH_FIGURES}
        else:
            job = collectives.average_scalars(self._epoch_figures(), name="hvdk8s.observability")
            if logs is not None:
                logs.update(job)
        if logs is not None and "loss" in logs:
            job["loss"] = float(logs["loss"])
            self.exporter.loss.set(job["loss"])
        self.exporter.set_job(job)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._epoch_start = None  # outside a fit, figures_for_average gives zeros


@dataclass
class _Sample:
    """Counters at the last read of the TensorFlow side: wall time, steps, examples, exposed allreduce seconds."""

    time: float = 0.0
    steps: int = 0
    examples: int = 0
    allreduce: float = 0.0
