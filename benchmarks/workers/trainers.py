"""One training interface over the five ways of training the same model.

Each trainer owns a model, an optimizer and a per-rank input pipeline and can
(a) time ``windows`` back-to-back windows of ``steps`` steps after a warm-up
and (b) train epochs until a test accuracy is reached. Keras 3 ``model.fit``
is used where it works (single process, hvdk8s); the others are custom loops
because Keras 3's fit breaks under MultiWorkerMirroredStrategy
(keras-team/keras#20585) and does not drive a ParameterServerStrategy cluster.
Every harness handles input the same way as Keras fit: one tf.function call
per step (``steps_per_execution=1``) that takes the dataset iterator and calls
``next`` on it inside the compiled step, so no harness pays an eager
``next()`` the others do not.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from . import workloads

# dataset_fn(rank, size, seed) -> per-rank batched, repeated dataset
DatasetFn = Callable[[int, int, Any], tf.data.Dataset]
ModelFn = Callable[[], keras.Model]
# evaluate(epoch, train_seconds_so_far) -> True once the target is reached (its time is not counted)
Evaluate = Callable[[int, float], bool]
# called after the warm-up and after every window of the trainer being timed
Between = Callable[[], None]


class Trainer:
    """Common timing logic; subclasses provide ``run(steps)`` (every worker does ``steps`` steps)."""

    model: keras.Model
    workers: int = 1

    def run(self, steps: int) -> None:
        raise NotImplementedError

    def timed(self, warmup: int, steps: int, windows: int, between: Between | None = None) -> list[float]:
        """Seconds for each of ``windows`` windows of ``steps`` steps, after ``warmup`` steps.

        ``between`` runs, untimed, after the warm-up and after each window: a paired
        trainer's warm-up and windows, so both alternate under the same machine load.
        """
        self.run(warmup)
        if between:
            between()
        out = []
        for _ in range(windows):
            start = time.perf_counter()
            self.run(steps)
            out.append(time.perf_counter() - start)
            if between:
                between()
        return out

    def to_accuracy(self, steps: int, max_epochs: int, evaluate: Evaluate, between: Between | None = None) -> None:
        """Train epochs of ``steps`` steps until ``evaluate`` says the target is reached.

        ``between`` runs, untimed, after every epoch's evaluation: a paired
        trainer's epoch, so both alternate under the same machine load.
        """
        elapsed = 0.0
        for epoch in range(1, max_epochs + 1):
            start = time.perf_counter()
            self.run(steps)
            elapsed += time.perf_counter() - start
            done = evaluate(epoch, elapsed)
            if between:
                between()
            if done:
                return

    def accuracy(self, x: Any, y: Any) -> float:
        return workloads.accuracy(self.model, x, y)


class Alternate:
    """A reference trainer's warm-up (none if ``warmup`` is 0), then its timed windows, one per call:
    the ``between`` of ``timed`` and ``to_accuracy``."""

    def __init__(self, trainer: Trainer, warmup: int, steps: int) -> None:
        self.trainer, self.warmup, self.steps = trainer, warmup, steps
        self.windows: list[float] = []
        self._warm = warmup == 0

    def __call__(self) -> None:
        if not self._warm:
            self.trainer.run(self.warmup)
            self._warm = True
            return
        start = time.perf_counter()
        self.trainer.run(self.steps)
        self.windows.append(time.perf_counter() - start)


class _WindowClock(keras.callbacks.Callback):
    """Window times from inside ``fit``: a window ends at the end of the compiled call whose first
    step is marked, and the next one starts after ``between`` (the paired trainer's window) has run.

    The call is known by the step ``on_train_batch_begin`` gets, its first on every Keras 3;
    ``on_train_batch_end`` gets the first step on Keras 3.8 and the last one on 3.15.
    """

    def __init__(self, marks: set[int], between: Between | None) -> None:
        super().__init__()
        self.marks, self.between = marks, between
        self.windows: list[float] = []
        self._start: float | None = None
        self._first_step = -1

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._first_step = batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._first_step not in self.marks:
            return
        if self._start is not None:
            self.windows.append(time.perf_counter() - self._start)
        if self.between:
            self.between()
        self._start = time.perf_counter()


class _EpochClock(keras.callbacks.Callback):
    """Training seconds per epoch, stopping ``fit`` once ``evaluate`` reports the target (eval not timed);
    ``between`` (a paired trainer's epoch) runs, untimed, after each evaluation."""

    def __init__(self, evaluate: Evaluate, between: Between | None) -> None:
        super().__init__()
        self.evaluate, self.between = evaluate, between
        self.elapsed = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.elapsed += time.perf_counter() - self._start
        if self.evaluate(epoch + 1, self.elapsed):
            self.model.stop_training = True
        if self.between:
            self.between()


class KerasFitTrainer(Trainer):
    """``model.fit``: a plain single process, or hvdk8s's DistributedOptimizer (``fp16``: with Horovod's
    fp16 gradient compression) and callbacks; ``steps_per_execution`` as in Keras's ``compile``.

    Windows are timed by a callback inside one ``fit`` call, so fit's own
    set-up is not charged to the steps; hvdk8s's callbacks run before it.
    Time to accuracy is one ``fit`` call over all epochs, as users train.
    """

    def __init__(
        self, model_fn: ModelFn, dataset_fn: DatasetFn, lr: float, *, use_hvdk8s: bool, fp16: bool = False,
        steps_per_execution: int = 1,
    ) -> None:
        self.model = model_fn()
        self.steps_per_execution = steps_per_execution
        self.callbacks: list[keras.callbacks.Callback] = []
        opt = workloads.optimizer(lr)
        rank, size = 0, 1
        if use_hvdk8s:
            import hvdk8s

            rank, size = hvdk8s.rank(), hvdk8s.size()
            opt = hvdk8s.DistributedOptimizer(
                opt, compression=hvdk8s.Compression.fp16 if fp16 else hvdk8s.Compression.none
            )
            self.callbacks = hvdk8s.default_callbacks()
        self.workers = size
        self.model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", jit_compile=False,
                           steps_per_execution=steps_per_execution)
        self.data = dataset_fn(rank, size, 0)

    def _fit(self, steps: int, clock: keras.callbacks.Callback, epochs: int = 1) -> None:
        self.model.fit(self.data, steps_per_epoch=steps, epochs=epochs, verbose=0, callbacks=[*self.callbacks, clock])

    def timed(self, warmup: int, steps: int, windows: int, between: Between | None = None) -> list[float]:
        k = self.steps_per_execution
        if warmup < 1 or warmup % k or steps % k:
            raise ValueError(f"warmup={warmup}, steps={steps}: Keras fit timing needs at least one warm-up step, "
                             f"and both must be multiples of steps_per_execution={k}")
        # fit calls the batch hooks once per compiled call; the clock marks calls by their first step
        clock = _WindowClock({warmup - k + n * steps for n in range(windows + 1)}, between)
        self._fit(warmup + steps * windows, clock)
        return clock.windows

    def to_accuracy(self, steps: int, max_epochs: int, evaluate: Evaluate, between: Between | None = None) -> None:
        self._fit(steps, _EpochClock(evaluate, between), epochs=max_epochs)


class LoopTrainer(Trainer):
    """A custom loop: ``self._step(iterator)`` is one compiled step that reads its own batch."""

    _step: Any
    _it: Any

    def run(self, steps: int) -> None:
        loss = None
        for _ in range(steps):
            loss = self._step(self._it)
        if loss is not None:
            loss.numpy()


class HorovodLoopTrainer(LoopTrainer):
    """The reference: ``horovod.tensorflow.DistributedGradientTape`` in a tf.function step."""

    def __init__(self, model_fn: ModelFn, dataset_fn: DatasetFn, lr: float) -> None:
        import horovod.tensorflow as hvd

        self.workers = hvd.size()
        self.model = model_fn()
        opt = workloads.optimizer(lr)
        opt.build(self.model.trainable_variables)
        # Horovod's tape and broadcast want tf.Variables, not Keras 3 wrappers.
        tf_vars = [v.value for v in self.model.trainable_variables]
        hvd.broadcast_variables([v.value for v in self.model.variables + opt.variables], root_rank=0)
        loss_fn = workloads.per_example_loss()
        model = self.model

        @tf.function
        def step(iterator: Any) -> tf.Tensor:
            x, y = next(iterator)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            grads = hvd.DistributedGradientTape(tape).gradient(loss, tf_vars)
            opt.apply(grads, model.trainable_variables)
            return loss

        self._step = step
        self._it = iter(dataset_fn(hvd.rank(), hvd.size(), 0))


class MirroredTrainer(LoopTrainer):
    """MultiWorkerMirroredStrategy (RING all-reduce), synchronous, custom loop."""

    def __init__(self, strategy: tf.distribute.Strategy, model_fn: ModelFn, dataset_fn: DatasetFn, lr: float, batch: int) -> None:
        self.strategy = strategy
        self.workers = strategy.num_replicas_in_sync
        with strategy.scope():
            self.model = model_fn()
            opt = workloads.optimizer(lr)
            opt.build(self.model.trainable_variables)
        loss_fn = workloads.per_example_loss()
        model, global_batch = self.model, batch * self.workers

        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces (sum) across replicas
            return loss

        @tf.function
        def step(iterator: Any) -> tf.Tensor:
            per_replica = strategy.run(replica_step, args=next(iterator))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._step = step
        dist = strategy.distribute_datasets_from_function(
            lambda ctx: dataset_fn(ctx.input_pipeline_id, ctx.num_input_pipelines, 0)
        )
        self._it = iter(dist)


class ParameterServerTrainer(Trainer):
    """ParameterServerStrategy driven by a ClusterCoordinator: asynchronous updates on the PS.

    Each worker applies its own gradients to the variables on the parameter
    servers without waiting for the others (no averaging), so the learning
    rate is the single-worker one and ``run(steps)`` schedules steps × workers.
    """

    def __init__(
        self, strategy: tf.distribute.Strategy, coordinator: Any, workers: int, model_fn: ModelFn, dataset_fn: DatasetFn, lr: float
    ) -> None:
        self.coordinator = coordinator
        self.workers = workers
        with strategy.scope():
            self.model = model_fn()
            opt = workloads.optimizer(lr)
            opt.build(self.model.trainable_variables)
        loss_fn = workloads.per_example_loss()
        model = self.model

        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def step(iterator: Any) -> tf.Tensor:
            return strategy.run(replica_step, args=next(iterator))

        self._step = step
        # Workers sample the whole set independently (unseeded shuffle), as asynchronous PS training does.
        per_worker = coordinator.create_per_worker_dataset(lambda: dataset_fn(0, 1, None))
        self._it = iter(per_worker)

    def run(self, steps: int) -> None:
        for _ in range(steps * self.workers):
            self.coordinator.schedule(self._step, args=(self._it,))
        self.coordinator.join()
