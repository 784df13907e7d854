"""``horovod.tensorflow.keras.callbacks`` for Keras 3: Horovod's names, arguments and numbers.

The learning-rate callbacks compute Horovod's formulas exactly (``initial_lr``
is the already-scaled rate; a constant multiplier ``m`` means
``m ** (epoch - start_epoch)``; warm-up ends on the last batch of its last
epoch). Where Keras 3 forces a difference, the class docstring says so.

Each Horovod callback here (broadcast, metric average, the rate callbacks) is a
``DistributedFitCallback``: when ``fit`` begins it gives a model compiled with
a ``DistributedOptimizer`` Horovod's step (``fit_step.install``: XLA off, the
lean per-step call), whichever of them ``fit`` calls first. Keras calls no
library code between ``compile`` and the first step's trace but the callbacks
``fit`` is given, so a Horovod script (``BroadcastGlobalVariablesCallback(0)``
in ``fit``) trains with the same step as ``default_callbacks()``. Their own
hooks do only what their names say.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import keras

from hvdk8s import collectives, runtime
from hvdk8s.collectives import variable_key
from hvdk8s.common import argcheck
from hvdk8s.train import fit_step, schedule
from hvdk8s.train.optimizer import is_distributed, reduces_gradients


class DistributedFitCallback(keras.callbacks.Callback):
    """Base of hvdk8s's Horovod callbacks: ``fit`` trains a distributed model with Horovod's step.

    At train begin, a model whose optimizer is a ``DistributedOptimizer``
    (or a ``LossScaleOptimizer`` around one) gets XLA switched off and
    hvdk8s's lean per-step call (``fit_step.install``, idempotent: the first of
    these callbacks does it); any other model is left as Keras made it.
    Subclasses that override ``on_train_begin`` call this one first.
    """

    def on_train_begin(self, logs: dict | None = None) -> None:
        fit_step.install(self.model)


class BroadcastGlobalVariablesCallback(DistributedFitCallback):
    """Broadcast the model's and the optimizer's variables from ``root_rank`` once, before training diverges.

    A model that is already built is broadcast at train begin, so every rank
    takes its first step from the same weights; a model that Keras builds
    during the first step (no ``Input``) is broadcast after that step, as in
    Horovod. As in Horovod, one instance broadcasts once: a later ``fit`` call
    with the same callback (a script that calls ``fit`` once per epoch) starts
    from weights the ranks already share and broadcasts nothing; given another
    model, it broadcasts that one once. ``local_variables`` (Keras or TF variables) keep each rank's
    values. ``device`` is accepted for Horovod compatibility (a placement hint
    Horovod uses for the broadcast; here the variables' own device is used).
    Warns when Keras's own ``train_step`` would apply each rank's gradients
    with an optimizer that is not distributed: the ranks would silently
    diverge (a ``train_step`` of the model's own may reduce them itself, with
    ``DistributedGradientTape``). As a ``DistributedFitCallback``, it gives a
    distributed model Horovod's step when ``fit`` begins.

    Args:
        root_rank: The rank whose variables every rank takes (usually 0).
        device: Accepted for Horovod compatibility; not used.
        local_variables: A variable, or several, to leave out of the broadcast (see
            ``register_local_var``); None for none.

    Raises:
        TypeError: ``root_rank`` is not a whole number.
        ValueError: ``root_rank`` is negative; or, when it broadcasts, not a rank of the job.

    Example:
        ```python
        model.fit(dataset, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                      hvd.callbacks.MetricAverageCallback()])
        ```
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = argcheck.whole("root_rank", root_rank, least=0)  # the job's size is checked at broadcast
        self.device = device
        self.broadcast_done = False
        self._broadcast_model: Any = None
        self._local_vars: set = set()
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, Iterable):
            local_variables = [local_variables]
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Leave ``var`` out of the broadcast, so each rank keeps its own value.

        Args:
            var: A Keras variable or the ``tf.Variable`` behind one.
        """
        self._local_vars.add(variable_key(var))

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        optimizer = self.model.optimizer
        keras_step = type(self.model).train_step is keras.Model.train_step
        if optimizer is not None and not reduces_gradients(optimizer) and keras_step and runtime.size() > 1:
            warnings.warn(
                f"hvdk8s: the model's optimizer ({type(optimizer).__name__}) is not a DistributedOptimizer, so each "
                "rank applies only its own gradients and the ranks diverge; wrap it with "
                "hvdk8s.DistributedOptimizer, or load saved models with hvdk8s.load_model", stacklevel=2,
            )
        if self._broadcast_model is not self.model:
            self.broadcast_done = False
        if self.model.built and not self.broadcast_done:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.broadcast_done:
            self._broadcast()

    def _broadcast(self) -> None:
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        variables = [v for v in self.model.variables if variable_key(v) not in self._local_vars]
        if optimizer is not None:
            variables += list(optimizer.variables)
        collectives.broadcast_variables(variables, self.root_rank)
        self.broadcast_done, self._broadcast_model = True, self.model


class MetricAverageCallback(DistributedFitCallback):
    """Replace each numeric epoch log (loss, metrics, ``val_*``) by its mean over ranks, in one allreduce.

    Put it before callbacks that read the logs (ReduceLROnPlateau, early
    stopping, checkpoints, TensorBoard). ``device`` is accepted for Horovod
    compatibility. Callbacks after it can put per-rank epoch figures into the
    same allreduce (``add_figures``), so an epoch end costs one collective.
    Every rank must have it in its list: the allreduce waits for all of them.

    Args:
        device: Accepted for Horovod compatibility; not used.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device
        self.figures: list[Callable[[], dict[str, float]]] = []

    def add_figures(self, source: Callable[[], dict[str, float]]) -> None:
        """Average ``source()``'s figures with the logs at each epoch end; their means go into the logs.

        Every rank must add the same sources, returning the same keys; a later
        source's key wins over an earlier one's. Adding a source twice adds it once.

        Args:
            source: Called at each epoch end; returns this rank's figures by name.
        """
        if source not in self.figures:
            self.figures.append(source)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None:
            return
        values = {k: float(v) for k, v in logs.items() if isinstance(v, numbers.Real)}
        for source in self.figures:
            values.update(source())
        if values:
            logs.update(collectives.average_scalars(values))


def _get(value: Any) -> float:
    return float(keras.ops.convert_to_numpy(value))


def _stepping_optimizer(optimizer: Any) -> Any:
    """The ``DistributedOptimizer`` whose step runs the rate schedule: the model's own, or the one inside the
    ``LossScaleOptimizer`` that ``compile`` wraps it in under ``mixed_float16``; None for any other optimizer."""
    if is_distributed(optimizer):
        return optimizer
    return optimizer.inner_optimizer if reduces_gradients(optimizer) else None


class LearningRateScheduleCallback(DistributedFitCallback):
    """Set the rate to ``initial_lr × multiplier(epoch)`` for epochs in [``start_epoch``, ``end_epoch``).

    Horovod's semantics: ``initial_lr`` is the rate at the start of training
    (already scaled by ``size()``); a constant ``multiplier`` m decays
    exponentially, ``m ** (epoch - start_epoch)``; with ``staircase`` the rate
    changes at the first batch of each epoch (integer epoch), otherwise at
    every batch with ``epoch + batch / steps_per_epoch``.

    ``momentum_correction`` (Goyal et al. 2017) scales the momentum term by
    ``new_lr / old_lr`` for the step where the rate changes. Keras 3 compiles an
    optimizer's ``momentum`` into the train step as a constant, so instead of
    changing that constant for one step as Horovod does, the
    ``DistributedOptimizer`` scales SGD's momentum buffers by the same ratio
    inside the step, which yields the same update for SGD without Nesterov.
    For other optimizers it is not applied.

    With a ``DistributedOptimizer`` (also inside the ``LossScaleOptimizer``
    that ``compile`` wraps it in under ``mixed_float16``) nothing runs per
    batch: the callback registers with that optimizer's ``rate_schedule``
    (``schedule.RateSchedule``) at train begin, writes its epoch's per-batch
    rates once per epoch, and each step sets the next batch's rate after its
    update (or the loss scale's skip), so a batch starts with Horovod's rate
    in the variable (the first batch's is assigned when it starts). Other
    optimizers get Horovod's per-batch assignment. The rate of each epoch goes
    into the epoch logs as ``lr``.

    Args:
        initial_lr: The rate at the start of training, already scaled by ``size()``.
        multiplier: A constant ``m`` (the rate is ``initial_lr * m ** (epoch - start_epoch)``), or a function
            of the (possibly fractional) epoch returning the factor.
        start_epoch: First epoch the schedule applies to.
        end_epoch: Epoch at which it stops applying (exclusive); None for no end.
        staircase: Change the rate once per epoch (at its first batch) rather than at every batch.
        momentum_correction: Scale SGD's momentum by ``new_lr / old_lr`` when the rate changes (see above).
        steps_per_epoch: Batches per epoch, needed without ``staircase``; None (or 0) takes ``fit``'s number
            of steps when training begins.

    Raises:
        TypeError: ``initial_lr``, a constant ``multiplier``, ``start_epoch``, ``end_epoch`` or
            ``steps_per_epoch`` is not a number.
        ValueError: ``initial_lr`` is None (Horovod's message) or negative; a constant ``multiplier`` is
            negative; ``steps_per_epoch`` is negative; or, when training begins without ``staircase``, the
            number of steps per epoch is neither given nor known to ``fit`` (a dataset of unknown length).

    Example:
        ```python
        # a 5-epoch warm-up, then x0.1 every 30 epochs (initial_lr already scaled by size())
        lr = 0.0125 * hvd.size()
        callbacks = [
            hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=5),
            hvd.callbacks.LearningRateScheduleCallback(lr, multiplier=lambda epoch: 0.1 ** (epoch // 30),
                                                       start_epoch=5),
        ]
        ```
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: float = 0,
        end_epoch: float | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: float | None = None,
    ) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = argcheck.real("initial_lr", initial_lr, least=0)
        if not callable(multiplier):
            argcheck.real("multiplier", multiplier, least=0)
        argcheck.real("start_epoch", start_epoch)
        if end_epoch is not None:
            argcheck.real("end_epoch", end_epoch)
        if steps_per_epoch:  # None or 0: fit's number, as in Horovod, which divides by it as a float
            argcheck.real("steps_per_epoch", steps_per_epoch, above=0)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None
        self._correction: schedule.MomentumCorrection | None = None
        self._rates: schedule.RateTable | None = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        stepping = _stepping_optimizer(self.model.optimizer)
        self._correction, self._rates, created = None, None, False
        if stepping is not None:
            self._rates, created = stepping.rate_schedule.rate_table()
            if self.momentum_correction:
                self._correction, new = stepping.rate_schedule.momentum_correction()
                created = created or new
        if created:
            fit_step.rebuild(self.model)  # compiled before the step could set the rate or correct momentum
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(
                    f"{type(self).__name__}: could not autodetect the number of steps per epoch "
                    "(the dataset has no known length); pass steps_per_epoch="
                )

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch
        in_range = self._in_range(epoch)
        if self._correction is not None:
            self._correction.set_active(self, in_range)
        if self._rates is not None:  # out of range: no rates, so none of an earlier epoch's carries over
            self._rates.write(self._epoch_rates(epoch) if in_range else {})

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._correction is not None:
            self._correction.set_active(self, False)

    def _in_range(self, epoch: int) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _batch_rate(self, epoch: int, batch: int) -> float | None:
        """Horovod's assignment when ``batch`` of ``epoch`` starts: every batch's, or with staircase the first's."""
        if self.staircase:
            return self.initial_lr * self.multiplier(epoch) if batch == 0 else None
        return self.initial_lr * self.multiplier(epoch + float(batch) / self._steps_per_epoch())

    def _steps_per_epoch(self) -> float:
        """The per-batch schedule's ``steps_per_epoch``: given, or detected when training begins."""
        if not self.steps_per_epoch:
            raise ValueError(f"{type(self).__name__}: steps_per_epoch is unknown until training begins")
        return self.steps_per_epoch

    def _epoch_rates(self, epoch: int) -> dict[int, float]:
        """Horovod's assignments in this epoch, by batch: as many as the epoch runs, where ``fit`` knows it."""
        steps = self.params.get("steps") or self.steps_per_epoch or 1
        rates = {batch: self._batch_rate(epoch, batch) for batch in range(math.ceil(steps))}  # given as a float too
        return {batch: rate for batch, rate in rates.items() if rate is not None}

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        epoch = self.current_epoch
        if epoch is None or not self._in_range(epoch):
            return
        if self._rates is None:
            rate = self._batch_rate(epoch, batch)
        else:  # later batches' rates were set by the step before them
            rate = self._rates.first() if batch == 0 else None
        if rate is not None:
            self.model.optimizer.learning_rate = rate

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _get(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up from ``initial_lr / size()`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al. 2017).

    Horovod's formula, per batch: ``lr = initial_lr / size × (e × (size − 1) / warmup_epochs + 1)`` with
    ``e = epoch + (batch + 1) / steps_per_epoch``, so the last batch of the last warm-up epoch trains at
    ``initial_lr``. A ``LearningRateScheduleCallback`` for epochs ``[0, warmup_epochs)``, not staircased.

    Args:
        initial_lr: The rate after warm-up, already scaled by ``size()``.
        warmup_epochs: Epochs the warm-up lasts; 0 for none.
        momentum_correction: Scale SGD's momentum by ``new_lr / old_lr`` as the rate changes.
        steps_per_epoch: Batches per epoch; None (or 0) takes ``fit``'s number of steps when training begins.
        verbose: 1 prints on rank 0 when the warm-up ends.

    Raises:
        TypeError: ``initial_lr``, ``warmup_epochs`` or ``steps_per_epoch`` is not a number.
        ValueError: ``initial_lr`` is None (Horovod's message) or negative; ``warmup_epochs`` or
            ``steps_per_epoch`` is negative; or, when training begins, the number of steps per epoch is
            neither given nor known to ``fit``.

    Example:
        ```python
        lr = 0.01 * hvd.size()
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)), loss=...)
        model.fit(dataset, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                      hvd.callbacks.MetricAverageCallback(),
                                      hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=5, verbose=1)])
        ```
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: float = 5,
        momentum_correction: bool = True,
        steps_per_epoch: float | None = None,
        verbose: int = 0,
    ) -> None:
        argcheck.real("warmup_epochs", warmup_epochs, least=0)  # a float, as Horovod's ImageNet example passes

        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self._steps_per_epoch()
            size = runtime.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
            momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and runtime.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get(self.model.optimizer.learning_rate):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's ``ModelCheckpoint`` with ``save_best_only=True`` (Horovod's signature).

    Horovod leaves ``filepath`` to be set later (its Spark estimator does);
    here it may also be passed. When training begins it must be set
    (``ValueError`` otherwise) and end in ``.keras`` (``.weights.h5`` with
    ``save_weights_only``): Keras 3 also takes a model path ending in ``.h5``
    and writes a legacy HDF5 file there, which ``hvdk8s.load_model`` refuses.
    It saves on every rank it is given to: give it to rank 0 alone.

    Args:
        monitor: The log entry to compare epochs by (Keras's).
        verbose: 1 prints a line when a model is saved (Keras's).
        save_weights_only: Save only the weights (``filepath`` ends in ``.weights.h5``).
        mode: ``"auto"``, ``"min"`` or ``"max"``: whether a lower or a higher ``monitor`` is better (Keras's).
        save_freq: ``"epoch"``, or save every this many batches (Keras's).
        filepath: Where to save; may be set later as ``.filepath``, before training begins.

    Raises:
        ValueError: When training begins, ``filepath`` is unset or does not end in ``.keras``
            (``.weights.h5`` with ``save_weights_only``).
    """

    _UNSET = "unset.keras"

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        filepath: str | None = None,
    ) -> None:
        placeholder = filepath or ("unset.weights.h5" if save_weights_only else self._UNSET)
        super().__init__(
            filepath=placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
            save_weights_only=save_weights_only, mode=mode, save_freq=save_freq,
        )
        self.filepath = filepath

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.filepath:
            raise ValueError("BestModelCheckpoint: set .filepath (or pass filepath=) before training")
        suffix = ".weights.h5" if self.save_weights_only else ".keras"
        if not str(self.filepath).endswith(suffix):
            legacy = (" (Keras would write a legacy HDF5 model there, which hvdk8s.load_model refuses: Keras 3 "
                      "cannot resume training from it; `hvdk8s migrate` rewrites .h5 checkpoint paths)"
                      if not self.save_weights_only and str(self.filepath).endswith((".h5", ".hdf5")) else "")
            raise ValueError(f"BestModelCheckpoint: filepath={self.filepath!r} must end in {suffix}{legacy}")
        super().on_train_begin(logs)
