"""Horovod's ``DistributedOptimizer`` and ``DistributedGradientTape`` for Keras 3.

``horovod.tensorflow.keras`` reduces gradients in Keras 2 hooks
(``_compute_gradients``, ``get_gradients``) that Keras 3 never calls, so under
Keras 3 its ``fit`` silently applies each rank's own gradients. Here the
wrapped optimizer reduces in Keras 3's public ``apply``, which ``model.fit``,
``apply_gradients`` and custom loops all go through, with Horovod's arguments,
defaults and semantics.

Mixed precision: Keras 3's ``LossScaleOptimizer`` checks the gradients for
inf/NaN and only calls its inner optimizer's ``apply`` when they are finite. Around a
``DistributedOptimizer`` that check would see each rank's own gradients, so a
rank whose float16 gradients overflow skips the reduction the others wait in.
``DistributedOptimizer(LossScaleOptimizer(opt))``, and the wrapper ``compile``
puts around a ``DistributedOptimizer`` (made distributed-aware when it builds
its inner optimizer), reduce the scaled gradients first, as Horovod does under
Keras 2, so every rank takes the same decision.

What this relies on in Keras beyond its documentation (the subclass saved
under the wrapped class's name, the loss-scale wrapper's flow, switching a
wrapper's class in place, finding it from the inner optimizer's ``build``,
untracked state) is in ``hvdk8s.train.keras_compat``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar

import keras
import tensorflow as tf
from horovod.tensorflow import Compression

from hvdk8s import collectives
from hvdk8s.collectives import Average, GradientReduction, global_process_set, variable_key
from hvdk8s.common import argcheck
from hvdk8s.train import keras_compat, schedule
from hvdk8s.train.fused import fused_bases

# Horovod 0.28.1's message (horovod/tensorflow/gradient_aggregation_eager.py, compute_gradients).
SPARSE_PASSES_ERROR = "IndexedSlices are not supported when `backward_passes_per_step` > 1 and `sparse_as_dense` is False."


def _after_batch(grads: Sequence[Any]) -> Any:
    """A context whose ops wait for ``grads``: in a compiled step, they run only if the step got its batch.

    With data of unknown length, ``fit`` ends each epoch with one more step
    call, whose ``next(iterator)`` raises ``OutOfRangeError``. TensorFlow
    still runs that call's ops that do not need the batch (automatic control
    dependencies order only ops on one resource), so an assignment that reads
    only variables (the rate table's, the momentum correction's, the pass
    counter's) would take effect in a step that trained on nothing. Eager
    code runs in order: a no-op there. Gradients given as constants (not
    tensors) need no batch and are not waited for.
    """
    return tf.control_dependencies([g for g in grads if isinstance(g, (tf.Tensor, tf.IndexedSlices))])


class _Accumulators:
    """Local gradient sums and the pass counter for ``backward_passes_per_step > 1``."""

    def __init__(self, grads: Sequence[Any]) -> None:
        with tf.init_scope():
            self.sums = [
                None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False) for g in grads
            ]
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """How a distributed optimizer class turns each rank's gradients into its update: Horovod's arguments.

    Held by the class ``DistributedOptimizer`` creates, so ``from_config``
    copies (which Keras and Horovod's own tests create) reduce exactly like the
    original.
    """

    base: type  # the wrapped optimizer's own class
    reduction: GradientReduction
    passes: int = 1  # backward_passes_per_step
    average_passes: bool = False  # average_aggregated_gradients
    scale_local: bool = True  # scale_local_gradients


class DistributedState:
    """One distributed optimizer's own state beside Keras's: local variables, pass accumulators, the reduced flag.

    A plain object on purpose: neither Keras nor TensorFlow tracking sees into
    it (``keras_compat.hold_untracked``), so checkpoints and exported models
    hold only the wrapped optimizer's own state and load without hvdk8s.
    """

    def __init__(self) -> None:
        self.local_keys: set = set()  # variable_key of each registered local variable
        self.accumulators: _Accumulators | None = None  # created by the first apply, with backward_passes_per_step > 1
        # True while the distributed LossScaleOptimizer around it applies gradients it has reduced already
        self.reduced = False


class _DistributedMixin:
    """Placed in front of the user's optimizer class in the MRO.

    Keras's own SGD gets ``fused.FusedSGD`` between the two: the same update
    in one kernel per variable. The class holds the Horovod settings
    (``aggregation``); each instance owns its ``distributed_state`` and its
    ``rate_schedule`` (which hvdk8s's rate callbacks register with).
    """

    aggregation: ClassVar[Aggregation]
    distributed_state: DistributedState
    rate_schedule: schedule.RateSchedule

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        keras_compat.hold_untracked(self, "distributed_state", DistributedState())
        keras_compat.hold_untracked(self, "rate_schedule", schedule.RateSchedule(self))  # type: ignore[arg-type]

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: not reduced, and divided by size (unless ``scale_local_gradients=False``)."""
        self.distributed_state.local_keys.add(variable_key(var))

    def build(self, variables: list[Any]) -> None:
        super().build(variables)  # type: ignore[misc]
        # A LossScaleOptimizer builds its inner optimizer in its own build: switch it over here, also where no
        # hvdk8s callback runs (an elastic script's warm-up fit). fit builds it inside the first step's trace,
        # where the wrapper's apply has begun in Keras's class: the switched class's check_finite then agrees
        # that step's decision across ranks. Called directly from here (keras_compat.wrapping_loss_scale).
        distribute_loss_scale(keras_compat.wrapping_loss_scale(self))

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        grads = list(grads)
        variables = None if trainable_variables is None else list(trainable_variables)
        if self.distributed_state.reduced:
            # Called by its distributed LossScaleOptimizer with gradients already reduced (and unscaled).
            return self._update(grads, variables)
        if variables is not None and not self.built:  # type: ignore[attr-defined]
            self.build(variables)  # type: ignore[attr-defined]  # not inside a tf.cond branch
        applied = self._apply_passes(grads, variables, self._update)
        with _after_batch(grads):
            self.rate_schedule.after_update()
        return applied

    def _update(self, reduced: list[Any], variables: list[Any] | None) -> Any:
        """The wrapped optimizer's own update, with reduced gradients."""
        with _after_batch(reduced):
            self.rate_schedule.before_update()
        return super().apply(reduced, variables)  # type: ignore[misc]

    def _apply_passes(
        self, grads: list[Any], variables: list[Any] | None, update: Callable[[list[Any], list[Any] | None], Any]
    ) -> Any:
        """Reduce, then ``update``; with ``backward_passes_per_step`` > 1 accumulate until the pass that updates.

        ``update`` is ``_update``, or a distributed ``LossScaleOptimizer``'s
        decision (which may skip the update: ``iterations`` then does not count
        that pass, as in Keras).
        """
        passes = self.aggregation.passes
        if passes == 1:
            return update(self._reduce(grads, variables), variables)
        if not self.aggregation.reduction.sparse_as_dense and any(isinstance(g, tf.IndexedSlices) for g in grads):
            # Horovod's LocalGradientAggregationHelper[Eager] raises this; it densifies only with sparse_as_dense.
            raise ValueError(SPARSE_PASSES_ERROR)
        state = self.distributed_state
        if state.accumulators is None:
            state.accumulators = _Accumulators(grads)
        acc = state.accumulators
        for total, grad in zip(acc.sums, grads):
            if total is not None:
                total.assign_add(tf.convert_to_tensor(grad))
        with _after_batch(grads):
            acc.counter.assign_add(1)

        def reduce_and_apply() -> tf.Tensor:
            summed = [None if t is None else t.read_value() for t in acc.sums]
            reduced = self._reduce(summed, variables)
            if self.aggregation.average_passes:
                reduced = [None if r is None else r / passes for r in reduced]
            update(reduced, variables)
            # The next cycle starts from zero (Horovod clears when its counter is back at 0), so a
            # non-finite gradient never leaks into it.
            acc.counter.assign(0)
            for total in acc.sums:
                if total is not None:
                    total.assign(tf.zeros_like(total))
            return tf.constant(True)

        def count_pass() -> tf.Tensor:
            # Horovod counts every backward pass in ``iterations``, applied or not.
            self.iterations.assign_add(1)  # type: ignore[attr-defined]
            return tf.constant(False)

        return tf.cond(acc.counter >= passes, reduce_and_apply, count_pass)

    def _reduce(self, grads: list[Any], variables: list[Any] | None) -> list[Any]:
        aggregation = self.aggregation
        return reduce_keeping_locals(
            aggregation.reduction, grads, variables, self.distributed_state.local_keys, aggregation.scale_local
        )


def reduce_keeping_locals(
    reduction: GradientReduction,
    grads: list[Any],
    variables: list[Any] | None,
    local: set,
    scale_local: bool,
) -> list[Any]:
    """Reduce the gradients of shared variables; keep those of ``local`` ones, divided by size if ``scale_local``.

    Horovod scales local gradients by 1/size so that, summed over ranks, they
    weigh like one averaged gradient (horovod#3695).
    """
    if not local:
        return collectives.reduce_gradients(reduction, grads, variables)
    if variables is None:
        raise ValueError("local variables are registered: pass the variables with the gradients "
                         "(apply_gradients(zip(grads, variables)))")
    is_local = [variable_key(v) in local for v in variables]
    shared = collectives.reduce_gradients(reduction, [None if loc else g for g, loc in zip(grads, is_local)], variables)
    size = collectives.runtime_size(reduction.process_set) if scale_local and any(is_local) else None
    return [
        (g if size is None or g is None else _divide(g, size)) if loc else r
        for g, loc, r in zip(grads, is_local, shared)
    ]


def _divide(grad: Any, size: tf.Tensor) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(size, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(size, grad.dtype)


class _DistributedLossScaleMixin:
    """Placed in front of ``keras.optimizers.LossScaleOptimizer`` whose inner optimizer is a ``DistributedOptimizer``.

    ``apply`` gives the scaled gradients to the inner optimizer's own pass
    handling (local variables, compression, ``backward_passes_per_step``
    accumulation), which reduces them and, on the pass that updates, hands the
    reduced gradients to Keras's ``LossScaleOptimizer.apply`` instead of its own
    update. Keras's check for inf/NaN, its unscaling, the scale's halving and
    growth all run unchanged, on gradients every rank holds alike, so every rank
    skips the same steps and keeps the same scale. The inner optimizer's update
    then runs without reducing again. The class keeps Keras's name, module and
    config, so saved models load with plain Keras.
    """

    inner_optimizer: Any

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        inner = self.inner_optimizer
        grads = list(grads)
        variables = None if trainable_variables is None else list(trainable_variables)
        if not self.built:  # type: ignore[attr-defined]
            self.build(variables)  # type: ignore[attr-defined]  # builds the inner optimizer too; not inside a tf.cond
        applied = inner._apply_passes(grads, variables, self._decide)
        with _after_batch(grads):
            inner.rate_schedule.after_update()
        return applied

    def check_finite(self, grads: Any) -> Any:
        """Keras's check; outside ``apply``'s reduced path, agreed across ranks (a step traced before the switch)."""
        finite = super().check_finite(grads)  # type: ignore[misc]
        if self.inner_optimizer.distributed_state.reduced:
            return finite  # reduced gradients: the same on every rank
        # The step being traced started in Keras's apply, before this wrapper was switched over (fit builds the
        # optimizer inside its first step, Keras 3.8 and 3.15 alike): every rank must take the same branch, and
        # the inner optimizer then reduces in it as usual.
        return collectives.all_true(finite)

    def _decide(self, reduced: list[Any], variables: list[Any] | None) -> None:
        """Keras's loss-scale step on reduced gradients; the inner optimizer updates without reducing."""
        with _reduced(self.inner_optimizer):
            super().apply(reduced, variables)  # type: ignore[misc]

    def register_local_var(self, var: Any) -> None:
        """The inner ``DistributedOptimizer``'s (``PartialDistributedOptimizer`` registers its local layers here)."""
        self.inner_optimizer.register_local_var(var)


@contextlib.contextmanager
def _reduced(optimizer: Any) -> Iterator[None]:
    """While tracing (or running) the body, ``optimizer.apply`` takes its gradients as already reduced."""
    optimizer.distributed_state.reduced = True
    try:
        yield
    finally:
        optimizer.distributed_state.reduced = False


@functools.cache
def _loss_scale_class(base: type) -> type:
    if issubclass(base, _DistributedLossScaleMixin):
        return base
    return keras_compat.loss_scale_subclass(base, _DistributedLossScaleMixin)


def distribute_loss_scale(optimizer: Any) -> bool:
    """Make a ``LossScaleOptimizer`` around a ``DistributedOptimizer`` reduce before its finiteness check.

    ``model.compile`` puts such a wrapper around the model's optimizer under the
    ``mixed_float16`` policy. Called when the wrapper builds its inner optimizer
    (``fit`` builds it inside the first step's trace, on Keras 3.8 and 3.15
    alike, and that step's decision ``check_finite`` then agrees across ranks;
    a ``build`` by hand or by ``KerasState.sync`` comes before any trace) and by
    ``fit_step.install`` (when ``fit`` begins with hvdk8s's Horovod callbacks; it retraces the step). It changes
    the object in place (``keras_compat.reclass``: its class becomes the distributed-aware subclass, which
    overrides only ``apply`` and ``check_finite``), so its variables, its state
    and every reference to it (elastic state, checkpoints) stay as they are.
    Returns whether it changed anything.
    """
    if (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        and not isinstance(optimizer, _DistributedLossScaleMixin)
        and is_distributed(optimizer.inner_optimizer)
    ):
        keras_compat.reclass(optimizer, _loss_scale_class(optimizer.__class__))
        return True
    return False


def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[Any]] | None = None,
    process_set: Any = global_process_set,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """Wrap a Keras 3 optimizer so each update uses gradients reduced across ranks (Horovod's signature).

    The result is an instance of a subclass named like the original (same
    module, same ``get_config``), so models saved during training load with
    plain Keras. It is made from ``optimizer``'s config: ``optimizer``'s own
    state (slots, ``iterations``) is not carried over. Every update, through
    ``fit``, ``apply_gradients`` or ``apply``, first reduces the gradients; the
    arguments after ``optimizer`` are Horovod's, with Horovod's defaults and
    meaning.

    A ``keras.optimizers.LossScaleOptimizer`` comes back as one (same scale
    settings and config, so ``compile`` does not wrap it again) around the
    distributed inner optimizer, reducing the scaled gradients before Keras
    checks them for inf/NaN, so all ranks skip the same steps; the wrapper
    ``compile`` puts around the result under ``mixed_float16`` is made to do
    the same. An optimizer that is already distributed is wrapped afresh with
    these settings.

    Args:
        optimizer: The Keras 3 optimizer to distribute (a ``LossScaleOptimizer``: its inner optimizer).
        name: Prefix of the reduction ops' names; None for ``Distributed<optimizer class name>``.
        device_dense: Device of the allreduces of dense gradients, passed to Horovod's ops ("" for
            Horovod's default).
        device_sparse: Device of the allgathers of sparse gradients, passed to Horovod's ops.
        compression: ``Compression.none``, or ``Compression.fp16`` to send floating-point gradients as
            float16 (the names ``"none"`` and ``"fp16"`` are taken too).
        sparse_as_dense: Reduce sparse (``IndexedSlices``) gradients as dense tensors; False allgathers
            their values and indices instead.
        gradient_predivide_factor: With ``op=Average``, divide the gradients by this before the sum and
            by ``size / gradient_predivide_factor`` after it; 1.0 averages after the sum.
        op: ``hvdk8s.Average``, ``hvdk8s.Sum`` or ``hvdk8s.Adasum``. Adasum reduces each tensor on its
            own (Horovod 0.28.1's grouped Adasum fails), takes no ``groups``,
            ``gradient_predivide_factor`` or sparse gradients, and on CPU needs a power-of-two number of
            ranks.
        backward_passes_per_step: Accumulate this many backward passes locally, counting each in
            ``iterations``, and reduce and update on the last; sparse gradients need
            ``sparse_as_dense=True`` then.
        average_aggregated_gradients: Average the accumulated passes instead of summing them.
        num_groups: Horovod's older spelling of ``groups=n``, used when ``groups`` is None; 0 for none.
        groups: None for one allreduce per gradient, started as soon as backprop produces it; ``n`` for
            ``n`` grouped allreduces over contiguous runs of gradients; a list of variable lists for one
            grouped allreduce per list (other variables get one each). Fewer groups overlap less
            communication with backprop.
        process_set: The Horovod process set whose ranks reduce together; a rank outside it applies its
            own gradients.
        scale_local_gradients: Divide the gradients of local variables (``register_local_var``), which
            are not reduced, by the number of ranks, so that summed over the ranks they weigh like one
            averaged gradient.

    Returns:
        The distributed optimizer, for ``model.compile`` or a custom loop's ``apply_gradients``.

    Raises:
        TypeError: ``optimizer`` is not a ``keras.optimizers.Optimizer``; ``backward_passes_per_step`` is
            not a whole number; ``gradient_predivide_factor`` is not a number; ``sparse_as_dense`` is not a
            bool; ``process_set`` is not a ``ProcessSet``; ``compression`` is neither a Horovod compressor
            nor a name (None, say).
        ValueError: ``backward_passes_per_step`` is below 1; ``op`` is not one of the three;
            ``compression`` is an unknown name; ``groups`` is neither a positive count nor a list of
            variable lists; ``gradient_predivide_factor`` is not above 0, or not 1.0 with an ``op`` other
            than ``Average``; ``Adasum`` with ``groups``, or on CPU with a number of ranks that is not a
            power of two. At an update: a sparse gradient without ``sparse_as_dense`` where
            ``backward_passes_per_step`` > 1 (Horovod's message), with ``Adasum``, or with a
            ``gradient_predivide_factor`` other than 1.0; or gradients without their variables where
            ``groups`` lists variables or local variables are registered.

    Example:
        ```python
        hvd.init()
        opt = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
        model.compile(optimizer=hvd.DistributedOptimizer(opt), loss="sparse_categorical_crossentropy")
        model.fit(dataset, epochs=10, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        ```
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer: expected a keras.optimizers.Optimizer, got {type(optimizer).__name__}")
    passes = argcheck.whole("backward_passes_per_step", backward_passes_per_step)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = DistributedOptimizer(
            optimizer.inner_optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=passes,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients,
        )
        config = optimizer.get_config()
        del config["inner_optimizer"]
        return _loss_scale_class(optimizer.__class__)(inner, **config)
    base = optimizer.aggregation.base if is_distributed(optimizer) else type(optimizer)
    reduction = GradientReduction.create(
        op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
        process_set=process_set, device_dense=device_dense, device_sparse=device_sparse,
        name=name or f"Distributed{base.__name__}",
    )
    aggregation = Aggregation(
        base=base, reduction=reduction, passes=passes,
        average_passes=bool(average_aggregated_gradients), scale_local=bool(scale_local_gradients),
    )
    cls: type[Any] = keras_compat.distributed_subclass(
        base, (_DistributedMixin, *fused_bases(base)), {"aggregation": aggregation}
    )
    return cls.from_config(optimizer.get_config())


def PartialDistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    groups: int | Sequence[Sequence[Any]] | None = None,
    process_set: Any = global_process_set,
    local_layers: keras.layers.Layer | Iterable[keras.layers.Layer] | None = None,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """``DistributedOptimizer`` whose ``local_layers`` keep their gradients local (``horovod.keras``'s).

    The gradients of the local layers' trainable weights are not reduced:
    each rank updates them with its own, divided by the number of ranks unless
    ``scale_local_gradients=False``. The other arguments are
    ``DistributedOptimizer``'s (Horovod's signature, which has no
    ``backward_passes_per_step`` here).

    Args:
        optimizer: The Keras 3 optimizer to distribute.
        name: Prefix of the reduction ops' names; None for ``Distributed<optimizer class name>``.
        device_dense: Device of the allreduces of dense gradients, passed to Horovod's ops.
        device_sparse: Device of the allgathers of sparse gradients, passed to Horovod's ops.
        compression: ``Compression.none`` or ``Compression.fp16`` (or their names).
        sparse_as_dense: Reduce sparse gradients as dense tensors instead of allgathering them.
        gradient_predivide_factor: With ``op=Average``, the factor divided out before the sum and
            multiplied back after it.
        op: ``hvdk8s.Average``, ``hvdk8s.Sum`` or ``hvdk8s.Adasum``.
        groups: How the reduced gradients are grouped into allreduces (``DistributedOptimizer``'s).
        process_set: The Horovod process set whose ranks reduce together.
        local_layers: A Keras layer, or an iterable of them (``model.layers[:2]``), whose trainable weights
            keep their gradients local; None for none. Variables are not taken (as in Horovod): register
            them with the result's ``register_local_var``.
        scale_local_gradients: Divide the local gradients by the number of ranks.

    Returns:
        The distributed optimizer, with the local layers' weights registered (``register_local_var``).

    Raises:
        TypeError: As ``DistributedOptimizer``.
        ValueError: As ``DistributedOptimizer``; ``local_layers`` holds something other than Keras layers
            (Horovod's check); and at an update, gradients come without their variables
            (``apply_gradients(zip(grads, variables))`` passes them).
    """
    layers = _local_layers(local_layers)
    opt = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
    )
    for layer in layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def _local_layers(local_layers: Any) -> list[keras.layers.Layer]:
    """``PartialDistributedOptimizer``'s ``local_layers`` as a list: refused with Horovod's ``ValueError``
    where it holds anything but layers (a string, variables), naming the first such item's type."""
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    iterable = isinstance(local_layers, Iterable) and not isinstance(local_layers, (str, tf.Variable))
    items = list(local_layers) if iterable else [local_layers]
    wrong = [item for item in items if not isinstance(item, keras.layers.Layer)]
    if wrong:
        raise ValueError(f"local_layers: expected a Keras layer or several (their trainable weights stay local), "
                         f"got {type(wrong[0]).__name__}; register a variable with the optimizer's "
                         "register_local_var")
    return items


def is_distributed(optimizer: Any) -> bool:
    """True for an optimizer made by ``DistributedOptimizer`` (or loaded by ``hvdk8s.load_model``).

    False for a ``LossScaleOptimizer`` around one, whose skipped steps
    ``iterations`` does not count (``reduces_gradients`` is True for both).
    """
    return isinstance(optimizer, _DistributedMixin)


def is_distributed_class(cls: type) -> bool:
    """True for the classes ``DistributedOptimizer`` creates (loss-scale wrappers included)."""
    return issubclass(cls, (_DistributedMixin, _DistributedLossScaleMixin))


def reduces_gradients(optimizer: Any) -> bool:
    """Whether ``optimizer``'s updates use gradients reduced across ranks.

    A ``DistributedOptimizer``, or a ``LossScaleOptimizer`` around one (which
    ``distribute_loss_scale`` makes reduce before its finiteness check).
    """
    return is_distributed(optimizer) or (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and is_distributed(optimizer.inner_optimizer)
    )


class DistributedGradientTape:
    """``horovod.tensorflow.DistributedGradientTape``: ``gradient()`` returns rank-reduced gradients.

    Wraps a recorded tape (``hvd.DistributedGradientTape(tape)``, Horovod's
    usage) or records itself (``with DistributedGradientTape() as tape``).
    Everything except ``gradient`` is the wrapped tape's. For custom loops that
    apply with a plain optimizer; use it or ``DistributedOptimizer``, not both.
    With mixed precision, ``keras.optimizers.LossScaleOptimizer(opt)`` around a
    plain optimizer checks the reduced gradients, so every rank skips alike.
    The reduction arguments are Horovod's, with ``DistributedOptimizer``'s
    meaning.

    Args:
        gradtape: The recorded ``tf.GradientTape`` to wrap; None records with a tape of its own, made
            with ``tape_kwargs``.
        device_dense: Device of the allreduces of dense gradients, passed to Horovod's ops.
        device_sparse: Device of the allgathers of sparse gradients, passed to Horovod's ops.
        compression: ``Compression.none`` or ``Compression.fp16`` (or their names).
        sparse_as_dense: Reduce sparse gradients as dense tensors instead of allgathering them.
        op: ``hvdk8s.Average``, ``hvdk8s.Sum`` or ``hvdk8s.Adasum``.
        gradient_predivide_factor: With ``op=Average``, the factor divided out before the sum and
            multiplied back after it.
        num_groups: Horovod's older spelling of ``groups=n``, used when ``groups`` is None.
        groups: How gradients are grouped into allreduces (``DistributedOptimizer``'s).
        process_set: The Horovod process set whose ranks reduce together.
        scale_local_gradients: Divide the gradients of local sources (``register_local_source``) by the
            number of ranks.
        **tape_kwargs: ``tf.GradientTape``'s arguments (``persistent``, ``watch_accessed_variables``)
            for the tape it makes when ``gradtape`` is None.

    Raises:
        TypeError: As ``DistributedOptimizer`` for these arguments: ``gradient_predivide_factor``,
            ``sparse_as_dense``, ``process_set`` or ``compression`` of the wrong type.
        ValueError: As ``DistributedOptimizer`` for these arguments: ``op``, ``compression``,
            ``groups``, ``gradient_predivide_factor`` not above 0 or with an ``op`` other than ``Average``,
            or ``Adasum``'s limits.

    Example:
        ```python
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        ```
    """

    def __init__(
        self,
        gradtape: tf.GradientTape | None = None,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Any = Compression.none,
        sparse_as_dense: bool = False,
        op: Any = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: int | Sequence[Sequence[Any]] | None = None,
        process_set: Any = global_process_set,
        scale_local_gradients: bool = True,
        **tape_kwargs: Any,
    ) -> None:
        self._tape = gradtape if gradtape is not None else tf.GradientTape(**tape_kwargs)
        self._reduction = GradientReduction.create(
            op=op, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
            process_set=process_set, device_dense=device_dense, device_sparse=device_sparse,
            name="DistributedGradientTape",
        )
        self._scale_local = scale_local_gradients
        self._local: set = set()

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient local (Horovod's ``register_local_source``).

        Args:
            source: A variable (Keras's or the ``tf.Variable`` behind it) whose gradient each rank keeps,
                divided by the number of ranks unless ``scale_local_gradients=False``.
        """
        self._local.add(variable_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, use_generic_names: bool = False) -> Any:
        """The wrapped tape's gradients, reduced across ranks (Horovod's signature).

        Args:
            target: What to differentiate, as for ``tf.GradientTape.gradient``.
            sources: The variables or tensors to differentiate with respect to (a nested structure).
            output_gradients: Passed on to the wrapped tape.
            use_generic_names: Accepted for Horovod compatibility: it only names Horovod's allreduce ops,
                and hvdk8s names its own.

        Returns:
            The gradients, structured like ``sources``: reduced across the process set's ranks, local
            sources' kept as they are (divided by the number of ranks unless
            ``scale_local_gradients=False``); None where ``target`` does not depend on a source.

        Raises:
            ValueError: A sparse gradient with ``op=Adasum`` or a ``gradient_predivide_factor`` other than
                1.0, without ``sparse_as_dense``.
        """
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients)
        reduced = reduce_keeping_locals(
            self._reduction, tf.nest.flatten(grads), tf.nest.flatten(sources), self._local, self._scale_local
        )
        return tf.nest.pack_sequence_as(grads, reduced)
