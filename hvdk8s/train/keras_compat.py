"""Every use hvdk8s makes of Keras behaviour that Keras does not document, in one place.

Everywhere else hvdk8s uses Keras's public API. Each function or class here names one such use (two
functions share a use where it has two sides), and its docstring says why hvdk8s needs it (what Keras
offers no public way to do), the Keras versions it was checked on and what breaks if Keras changes it. ``tests/test_keras_compat.py`` has one test per use that fails
when Keras changes that behaviour, and runs on every supported stack (the Makefile's ``CORE_TESTS``);
it also fails when one of the tricks kept here (a ``__class__`` assignment, a walk up the call stack,
a Keras-private module or attribute) appears in any other file of the package.

Checked on Keras 3.8.0 (the TensorFlow 2.18 stack) and 3.15.1 (TensorFlow 2.19 to 2.21), with the
TensorFlow backend and no ``tf.distribute`` strategy, which is how hvdk8s runs Keras; the source read
is ``keras/src`` of those two releases. Where the two releases differ, the docstring says how.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import keras
import tensorflow as tf

# The first release whose generator and grain adapters put an empty tf.experimental.Optional where a batch
# holds None (none_for_optionals): absent from the 3.11.3 wheel, present in 3.12.0's (compared for
# tests/test_fit_step.py).
OPTIONALS_FOR_NONE_SINCE = (3, 12)


def keras_version() -> tuple[int, int]:
    """The installed Keras's (major, minor) version, for the version differences noted here.

    Returns:
        For example ``(3, 15)``.
    """
    major, minor = keras.version().split(".")[:2]
    return int(major), int(minor)


# --- optimizers ----------------------------------------------------------------------------------------------


def distributed_subclass(base: type, mixins: Iterable[type], namespace: Mapping[str, Any] | None = None) -> type:
    """A subclass of the optimizer class ``base`` with ``mixins`` in front, saved by Keras as ``base`` itself.

    Why: ``DistributedOptimizer`` has to change what the user's optimizer does on every update
    (reduce the gradients first) while remaining that optimizer for Keras: same config, same
    variables, and a saved model that loads without hvdk8s. Keras offers no hook around an optimizer's update,
    so the mixins override its public ``apply`` (and ``build``), relying on two things Keras does not
    document:

    * every update goes through ``Optimizer.apply(grads, trainable_variables)``: ``apply_gradients``
      calls it, ``fit``'s built-in ``train_step`` calls ``apply_gradients``, and a
      ``LossScaleOptimizer`` calls its inner optimizer's ``apply``;
    * Keras saves an object whose class it does not export under ``class.__module__`` and
      ``class.__name__``, with ``registered_name`` = ``__name__`` (nothing registered). Named like
      ``base``, in ``base``'s module (a ``keras.src`` module for Keras's own optimizers), the
      subclass is saved as ``base``: plain ``keras.models.load_model`` imports that module and finds
      ``base`` there, and ``hvdk8s.load_model``'s overrides take precedence by that registered name
      (``load_overrides``).

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: an update path that bypasses ``apply`` applies each rank's own
    gradients (the ranks silently diverge); a serialiser that records something else, or a loader
    that no longer imports ``keras.src`` modules, leaves models saved during distributed training
    unloadable by plain Keras, or ``hvdk8s.load_model`` bringing them back undistributed.

    Args:
        base: The optimizer class to extend (Keras's or the user's).
        mixins: The classes placed before ``base`` in the method resolution order.
        namespace: Class attributes of the new class.

    Returns:
        The new class: ``base``'s name and module, ``mixins`` then ``base`` as its bases.
    """
    attributes = {**(namespace or {}), "__module__": base.__module__}
    return type(base.__name__, (*mixins, base), attributes)


def loss_scale_subclass(base: type, mixin: type) -> type:
    """``base``, a ``LossScaleOptimizer`` class, with ``mixin``'s ``apply`` and ``check_finite`` in front.

    Why: under ``mixed_float16`` Keras decides whether to apply a step by checking the gradients for
    inf/NaN before its inner optimizer sees them; around a ``DistributedOptimizer`` that check would
    see each rank's own gradients. Keras offers no hook into that decision, so ``mixin`` overrides the
    wrapper's ``apply`` (to reduce first) and ``check_finite`` (to agree the decision across ranks),
    relying on how ``LossScaleOptimizer.apply`` works: it builds the wrapper if needed (which builds
    the inner optimizer), calls ``self.check_finite(grads)`` once, and then either divides each
    gradient by the scale and calls ``inner_optimizer.apply(unscaled, trainable_variables)`` once and
    counts towards growing the scale, or halves the scale without calling the inner optimizer. The
    class is made by ``distributed_subclass``, so it is saved as ``base``.

    Checked on: 3.8.0, 3.15.1 (3.15.1 also passes gradients of variables Keras overwrites with their
    gradient through unscaled).

    Breaks if Keras changes it: a decision taken elsewhere than ``check_finite``, or an inner update
    reached other than through one ``inner_optimizer.apply``, makes ranks decide on their own
    gradients (a rank whose float16 gradients overflow skips the reduction the others wait in) or
    reduce twice.

    Args:
        base: The loss-scale optimizer class.
        mixin: The class whose ``apply`` and ``check_finite`` come first.

    Returns:
        The new class, named and saved as ``base``.
    """
    return distributed_subclass(base, (mixin,))


def reclass(obj: Any, cls: type) -> None:
    """Make the existing object ``obj`` an instance of ``cls``, a subclass of its class, in place.

    Why: ``compile`` creates the ``LossScaleOptimizer`` around the model's optimizer itself (under
    ``mixed_float16``), so it is a plain Keras instance, which the model, elastic state, checkpoints
    and the user may already hold and whose variables may exist already. Keras offers no way to give
    that object the distributed decision (``loss_scale_subclass``) other than its class: assigning
    ``__class__`` keeps its identity, its variables and its config. Keras optimizers are plain Python
    classes whose state lives in the instance's ``__dict__`` and which define no ``__slots__``, so the
    assignment is allowed and moves nothing.

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: ``__slots__`` or another instance layout in Keras's optimizer classes
    makes the assignment raise ``TypeError``; state kept per class rather than per instance would be
    lost. Either way, the wrapper ``compile`` puts around a ``DistributedOptimizer`` under
    ``mixed_float16`` cannot be made to reduce first.

    Args:
        obj: The object to switch.
        cls: Its new class, a subclass of ``type(obj)`` that adds methods only.

    Raises:
        TypeError: ``cls`` is not a subclass of ``obj``'s class.
    """
    if not issubclass(cls, type(obj)):
        raise TypeError(f"reclass: {cls.__name__} is not a subclass of {type(obj).__name__}")
    obj.__class__ = cls


# Keras's LossScaleOptimizer calls its inner optimizer's ``build`` directly from its own ``build``; a few
# more frames allow for wrappers (decorators, name scopes, distribution strategies).
_CALLER_DEPTH = 6


def wrapping_loss_scale(optimizer: Any) -> Any:
    """The ``LossScaleOptimizer`` whose method called the caller of this function, if any, found up the stack.

    Call it from ``optimizer``'s own ``build``: it returns the wrapper building ``optimizer``, else None.

    Why: a ``LossScaleOptimizer`` holds its ``inner_optimizer``, but Keras gives the inner optimizer no
    reference to its wrapper (neither ``LossScaleOptimizer`` nor ``compile``, which creates the
    wrapper itself under ``mixed_float16``); the call stack while the wrapper builds its inner
    optimizer is the only place the wrapper shows. hvdk8s switches it over there (``reclass``), also
    where no hvdk8s callback runs in ``fit`` (an elastic script's warm-up).

    Relies on: ``LossScaleOptimizer.build`` calling ``self.inner_optimizer.build(var_list)`` itself,
    so the wrapper is ``self`` in a frame at most ``_CALLER_DEPTH`` frames above this function's
    caller. ``fit`` builds the optimizer inside the first step's trace (the wrapper's ``apply``
    builds it); the wrapper's ``build`` called directly (``KerasState.sync``,
    ``BroadcastGlobalVariablesCallback``) goes the same way.

    Checked on: 3.8.0, 3.15.1 (on both the wrapper's ``build`` is the frame right above the inner ``build``).

    Breaks if Keras changes it: if the wrapper builds its inner optimizer elsewhere, or more than
    ``_CALLER_DEPTH`` frames away, this returns None and a wrapper that ``compile`` made is switched
    only by ``fit_step.install`` (hvdk8s's callbacks): a ``fit`` without them decides each step on
    each rank's own gradients.

    Args:
        optimizer: The optimizer being built (the caller's ``self``).

    Returns:
        The ``keras.optimizers.LossScaleOptimizer`` whose ``inner_optimizer`` is ``optimizer``, or None.
    """
    frame = inspect.currentframe()
    try:
        frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
        for _ in range(_CALLER_DEPTH):
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            if isinstance(owner, keras.optimizers.LossScaleOptimizer) and owner.inner_optimizer is optimizer:
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame


def hold_untracked(owner: Any, name: str, value: Any) -> None:
    """Set ``owner.name = value`` where neither Keras nor TensorFlow tracks ``value`` (a plain Python object).

    Why: a ``DistributedOptimizer`` keeps state of its own (gradient accumulators, the rate table,
    the momentum correction: ``tf.Variable`` objects) that must stay out of ``optimizer.variables``,
    checkpoints and saved models, so those load with plain Keras and match a plain optimizer's
    variables one for one. Keras has no public "do not track" for optimizers; it relies on how
    assignment is tracked: Keras's ``__setattr__`` tracks ``keras.Variable`` objects and wraps lists,
    dicts and sets, and TensorFlow's tracking records only ``Trackable`` values, so an attribute
    holding any other object is seen by neither, nor is anything inside it.

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: tracking that looked into plain objects would add hvdk8s's variables
    to the optimizer's: checkpoints written during distributed training would not load into a plain
    optimizer, nor its checkpoints into a distributed one.

    Args:
        owner: A Keras optimizer.
        name: The attribute.
        value: A plain Python object (not a variable, list, dict, set or ``Trackable``).
    """
    setattr(owner, name, value)


def sgd_momentums(optimizer: keras.optimizers.SGD) -> list[Any]:
    """Keras's ``SGD`` momentum buffers, one per trainable variable it was built with.

    Why: Horovod's ``momentum_correction`` scales SGD's momentum term when the rate changes; Keras 3
    compiles ``momentum`` into the step as a constant, so hvdk8s scales the buffers instead, and
    Keras has no public accessor for them. Relies on ``SGD.build`` keeping them in the attribute
    ``momentums`` (empty when ``momentum`` is 0).

    Checked on: 3.8.0; 3.15.1, whose list holds None for a variable Keras overwrites with its
    gradient (float8 scale factors), left out here: it has no buffer.

    Breaks if Keras changes it: ``momentum_correction`` fails (no such attribute) or scales nothing.

    Args:
        optimizer: A built ``keras.optimizers.SGD`` (or subclass).

    Returns:
        The momentum variables, in ``build``'s order; empty without momentum.
    """
    return [m for m in optimizer.momentums if m is not None]


def sgd_momentum(optimizer: keras.optimizers.SGD, variable: Any) -> Any:
    """The momentum buffer Keras's ``SGD`` keeps for the trainable ``variable``.

    Why: the one-kernel SGD update (``fused``) updates the same buffer Keras's own update does, so
    the two stay interchangeable (a model trained fused continues unfused and vice versa). Keras has
    no public lookup: its ``SGD.update_step`` finds the buffer as ``momentums[_get_variable_index(
    variable)]``, a private method of the optimizer (the variable's index among those ``build`` got).

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: the fused update raises (no such method or attribute), or with a
    different order it updates another variable's buffer, which ``tests/test_fused.py``'s
    bit-for-bit comparison with Keras's update catches.

    Args:
        optimizer: A built ``keras.optimizers.SGD`` with momentum.
        variable: One of the trainable variables it was built with.

    Returns:
        That variable's momentum ``keras.Variable``.
    """
    return optimizer.momentums[optimizer._get_variable_index(variable)]


# --- loading -------------------------------------------------------------------------------------------------


def load_overrides(classes: Iterable[type], from_config: Callable[[type[Any], dict], Any]) -> dict[str, type]:
    """``custom_objects`` that make ``keras.models.load_model`` build each of ``classes`` with ``from_config``.

    Why: ``hvdk8s.load_model`` must bring a saved optimizer back distributed with its saved state,
    and Keras deserialises it inside ``load_model``, with no hook between. Keras does look a saved
    object's ``registered_name`` up in ``custom_objects`` before anything else, and a
    ``DistributedOptimizer`` is saved with its class's ``__name__`` there (``distributed_subclass``:
    the subclass itself is registered under no other name). So a subclass of each class, keyed by
    that name, whose ``from_config`` is ``from_config(cls, config)``, replaces the class while Keras
    loads.

    Checked on: 3.8.0, 3.15.1. On both, an optimizer saved from a plain Keras optimizer
    (``registered_name`` None, module ``keras.optimizers``) is not replaced: Keras resolves it by its
    public name, past ``custom_objects``, so such a model loads with its plain optimizer.

    Breaks if Keras changes it: ``hvdk8s.load_model`` returns the saved optimizer undistributed (each
    rank then trains on its own gradients; ``BroadcastGlobalVariablesCallback`` warns).

    Args:
        classes: The optimizer classes to replace.
        from_config: Called as ``from_config(cls, config)`` instead of ``cls.from_config(config)``.

    Returns:
        ``{class name: replacing class}``, for ``custom_objects``.
    """
    overrides: dict[str, type] = {}
    for cls in classes:

        def replaced(_cls: type, config: Mapping[str, Any], custom_objects: Any = None, original: type = cls) -> Any:
            return from_config(original, dict(config))

        overrides[cls.__name__] = distributed_subclass(cls, (), {"from_config": classmethod(replaced)})
    return overrides


def legacy_h5_saved_with_optimizer(filepath: str | os.PathLike[str]) -> bool:
    """Whether Keras would load ``filepath`` as a legacy HDF5 model that was saved with its optimizer.

    Why: Keras 3 cannot resume training from such a file, so ``hvdk8s.load_model`` refuses it (with
    what to do instead) rather than returning a model whose first step fails. Its legacy loader
    builds the restored optimizer with ``model.optimizer.build(model._trainable_variables)``: the
    model's own variables, none of its layers', so the first training step fails ("Unknown
    variable"; Keras 3.8 hides it behind "numpy() is only available when eager execution is
    enabled") and the saved optimizer state is dropped; it also deserialises the optimizer under its
    lower-cased class name, past ``load_overrides``. Keras offers no public way to tell the case
    apart; this reads what Keras's legacy format writes: ``load_model`` picks that loader by the
    suffix alone (``.h5``, ``.hdf5``), and the saver writes the file attribute ``training_config``
    only for a model saved with its optimizer.

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: a Keras that resumes from such files is refused needlessly
    (``tests/test_resume_h5.py`` then fails too); one that writes no ``training_config`` lets such
    files through to the failing first step.

    Args:
        filepath: The path given to ``load_model``.

    Returns:
        True for an HDF5 file under a legacy suffix holding ``training_config``; False otherwise,
        also for a missing or unreadable file (Keras's own error then says so).
    """
    if not str(filepath).endswith((".h5", ".hdf5")):
        return False
    import h5py

    try:
        with h5py.File(filepath, "r") as f:
            return "training_config" in f.attrs
    except OSError:
        return False


# --- fit -----------------------------------------------------------------------------------------------------

# What Keras's own train function treats as an epoch's iterator (anything else, such as the generator that
# train_on_batch passes, it iterates over).
EPOCH_ITERATORS = (tf.data.Iterator, tf.distribute.DistributedIterator)


def keras_train_function(model: keras.Model, force: bool = False) -> Callable[[Any], Any]:
    """The train function ``fit`` will call: the current one, or Keras's own made afresh if none or ``force``.

    Why: hvdk8s replaces ``fit``'s per-step call (``install_train_function``) and keeps Keras's own
    function for the calls the replacement does not take. Relies on ``make_train_function(force)``
    keeping the model's current ``train_function`` unless ``force`` (``compile`` resets it to None),
    and on ``make_train_function`` and the attribute it sets being what ``fit`` uses: Keras documents
    neither.

    Checked on: 3.8.0, 3.15.1 (both set the attribute and return nothing when they make a new one).

    Breaks if Keras changes it: a ``make_train_function`` that always rebuilds would discard an
    installed function (hvdk8s's step would not run), and one that stores it elsewhere would leave
    this returning a stale function.

    Args:
        model: A compiled model.
        force: Make Keras's own function anew even where one is current.

    Returns:
        ``model.train_function`` after ``model.make_train_function(force=force)``.
    """
    model.make_train_function(force=force)
    return model.train_function


def install_train_function(model: keras.Model, function: Callable[[Any], Any]) -> None:
    """Make ``function`` the call ``fit`` makes per step, until ``compile`` (or a forced rebuild) replaces it.

    Why: Keras's train function wraps ``train_step`` in a second compiled function returning a
    ``tf.experimental.Optional`` read by two eager ops per step; hvdk8s's lean call avoids them
    (``fit_step``). Keras has no public way to give ``fit`` another step function; this relies on
    how its TensorFlow trainer's ``fit`` runs: it calls ``make_train_function()`` (no ``force``,
    so an installed function stays) before ``callbacks.on_train_begin``, then calls
    ``self.train_function(iterator)`` once per compiled call with the epoch's iterator (one of
    ``EPOCH_ITERATORS``), and ends the epoch when that call raises ``StopIteration`` or
    ``tf.errors.OutOfRangeError``. ``train_on_batch`` calls it with a Python generator instead.

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: if ``fit`` stops reading ``train_function`` (or rebuilds it after
    ``on_train_begin``), hvdk8s's step silently stops being used (training still correct, only
    slower); if it passes something else than an iterator, the installed function hands every call
    to Keras's own.

    Args:
        model: A compiled model.
        function: Called as ``function(iterator)``; returns the step's logs.
    """
    model.train_function = function


def none_for_optionals(batch: Any) -> Any:
    """``batch`` with each ``tf.experimental.Optional`` in it (Keras's placeholder for a ``None``) made ``None``.

    Why: from Keras 3.12 on (``OPTIONALS_FOR_NONE_SINCE``), the generator and grain data adapters put
    an empty ``tf.experimental.Optional`` where a batch holds ``None`` (an optional input), and Keras's
    own train function turns it back into ``None`` before ``train_step`` (a private wrapper,
    ``_autoconvert_optionals``); a train function replacing Keras's must do the same. Earlier
    releases put nothing there (3.8's ``fit`` fails on such a batch), so this is a no-op on them.

    Checked on: 3.8.0 (no placeholder), 3.15.1.

    Breaks if Keras changes it: a different placeholder reaches ``train_step`` as data (a model with
    an optional input fails to trace, or computes with the placeholder).

    Args:
        batch: One batch as the iterator yields it.

    Returns:
        The same structure, ``None`` where it held an ``Optional``.
    """
    return keras.tree.map_structure(lambda item: None if isinstance(item, tf.experimental.Optional) else item, batch)


# --- metrics -------------------------------------------------------------------------------------------------


def loss_tracker(model: keras.Model) -> keras.metrics.Metric | None:
    """The metric in which Keras's built-in ``train_step`` counts the examples of each epoch, if any.

    Why: the observability callbacks report examples/s without being told the batch size, and Keras
    has no public count of examples trained on. Its built-in ``train_step`` updates the compiled
    model's loss metric (a ``keras.metrics.Mean`` named ``"loss"``, listed in ``model.metrics``)
    with each batch's size as the sample weight, so that metric's ``count`` (an undocumented
    attribute of ``Mean``) is the examples this epoch (``fit`` resets it each epoch); partial batches
    count exactly.

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: examples/s is reported as unknown (no such metric) or wrong (another
    weighting); callbacks given ``batch_size=`` count steps × batch size instead and are unaffected.

    Args:
        model: A compiled model.

    Returns:
        The tracker, or None (not compiled, or no ``count`` to read).
    """
    return next((m for m in model.metrics if m.name == "loss" and hasattr(m, "count")), None)


def examples_counted(tracker: keras.metrics.Metric) -> int:
    """The examples ``tracker`` (from ``loss_tracker``) has counted since ``fit`` last reset it.

    Args:
        tracker: The model's loss tracker.

    Returns:
        Its ``count``, as an int.
    """
    return int(keras.ops.convert_to_numpy(tracker.count))


# --- callbacks -----------------------------------------------------------------------------------------------


class CallSteps:
    """The steps of the train call ``fit`` is running, from the batch numbers its callback hooks get.

    Why: with ``steps_per_execution`` > 1 one call of the train function runs several steps, and the
    observability callbacks count the steps done when a call returns. Keras documents a hook's
    ``batch`` only as the batch's index in the epoch, and for a call of several steps the hooks get
    different ones: ``on_train_batch_begin`` the call's first step, ``on_train_batch_end`` the call's
    first step on Keras 3.8 but its last on 3.15. So the count goes by the first, noted by the begin
    hook (``begin``), the same on both.

    Checked on: 3.8.0, 3.15.1.

    Breaks if Keras changes it: the step counts and the progress bar run ahead of or behind the
    steps trained within an epoch (capped at the epoch's steps where ``fit`` knows them).
    """

    def __init__(self) -> None:
        self.first = 0

    def begin(self, batch: int) -> None:
        """Note the call's first step.

        Args:
            batch: ``on_train_batch_begin``'s ``batch``.
        """
        self.first = batch

    def done(self, model: keras.Model, params: Mapping[str, object]) -> int:
        """Steps finished this epoch once the call noted by ``begin`` returns.

        One call runs ``steps_per_execution`` steps, fewer at the end of an epoch of known length.

        Args:
            model: The model being trained.
            params: The callback's ``params`` (``fit``'s ``steps`` per epoch, when known).

        Returns:
            The steps finished this epoch.
        """
        done = self.first + int(getattr(model, "steps_per_execution", 1) or 1)
        total = params.get("steps")
        return min(done, int(total)) if isinstance(total, int) and total else done
