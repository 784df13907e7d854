"""Gradient and state collectives on Horovod's core TensorFlow ops.

The one place where hvdk8s talks to ``horovod.tensorflow``'s collectives (but
for ``runtime.init``'s one allgather of host names, which sits below this
module): the optimizer, the gradient tape, the callbacks and Horovod's
top-level functions (``allreduce``, ``broadcast`` ...) all go through here, so
they cannot disagree on grouping, compression or naming.

Nothing here decides by ``size()`` while a step is traced: Horovod's ops read
the job's size when they run, and gradient reductions are skipped by a
``tf.cond`` on that size (as Horovod's own ``_allreduce_cond`` does), so a
one-rank job does not wait a Horovod cycle per step, and a step traced on one
rank still reduces after an elastic job grows.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from horovod.tensorflow import Compression

from hvdk8s import commtime
from hvdk8s.common import argcheck

Average = hvd.Average
Sum = hvd.Sum
Adasum = hvd.Adasum
ProcessSet = hvd.ProcessSet
global_process_set = hvd.global_process_set
add_process_set = hvd.add_process_set
remove_process_set = hvd.remove_process_set

COMPRESSIONS: Mapping[str, Any] = {"none": Compression.none, "fp16": Compression.fp16}
# Horovod's reduction ops (ints), by the name a message gives them: hvdk8s exports the first three.
_OP_NAMES: Mapping[int, str] = {
    Average: "hvdk8s.Average", Sum: "hvdk8s.Sum", Adasum: "hvdk8s.Adasum",
    hvd.Min: "horovod.tensorflow.Min", hvd.Max: "horovod.tensorflow.Max", hvd.Product: "horovod.tensorflow.Product",
}


def resolve_compression(compression: str | Any) -> Any:
    """Accept Horovod's ``Compression.none``/``Compression.fp16`` (or another Horovod compressor) or their names.

    Raises:
        ValueError: A string other than ``"none"`` and ``"fp16"``.
        TypeError: Anything else without Horovod's ``compress`` and ``decompress`` (None, a bool ...).
    """
    if isinstance(compression, str):
        try:
            return COMPRESSIONS[compression]
        except KeyError:
            raise ValueError(f"compression={compression!r}: expected one of {sorted(COMPRESSIONS)}") from None
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression: expected hvdk8s.Compression.none or hvdk8s.Compression.fp16 (or their names), "
                        f"got {type(compression).__name__} {compression!r}")
    return compression


def _check_op(op: Any, allowed: Sequence[int]) -> None:
    """Refuse an ``op`` that is not one of ``allowed`` (Horovod's op constants) with a message naming them.

    A bool is refused too, though ``True == Sum``.
    """
    if isinstance(op, bool) or op not in allowed:
        raise ValueError(f"op={op!r}: expected one of {', '.join(_OP_NAMES[o] for o in allowed)}")


def variable_key(var: Any) -> Any:
    """A hashable key for a variable: Keras 3 variables are keyed by the tf.Variable backing them.

    ``keras.Variable`` is unhashable; the optimizer, the tape and user code may
    hold either the Keras variable or its ``value``, and both map to one key.
    """
    if isinstance(var, keras.Variable):
        var = var.value
    return var.ref()


def split_list(items: Sequence[Any], n: int) -> list[list[Any]]:
    """Horovod's ``split_list``: ``n`` contiguous chunks whose lengths differ by at most one."""
    d, r = divmod(len(items), n)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(n)]


@dataclass(frozen=True)
class GradientReduction:
    """How gradients are reduced: Horovod's ``DistributedOptimizer`` arguments, checked once.

    ``groups`` is Horovod's: ``None`` reduces each gradient with its own
    allreduce as soon as backprop produces it (Horovod's tensor fusion then
    batches those that are ready together); an int ``n`` makes ``n`` grouped
    allreduces over contiguous runs of variables; a list of variable lists
    makes one group per list (variables in no list get one each). A grouped
    allreduce waits for every gradient in it, so fewer groups mean less
    overlap of communication with backprop.
    """

    op: Any = Average
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    groups: int | tuple[frozenset, ...] | None = None
    process_set: Any = global_process_set
    device_dense: str = ""
    device_sparse: str = ""
    name: str = "hvdk8s.grads"

    @classmethod
    def create(
        cls,
        *,
        op: Any = Average,
        compression: Any = Compression.none,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: int | Sequence[Sequence[Any]] | None = None,
        process_set: Any = global_process_set,
        device_dense: str = "",
        device_sparse: str = "",
        name: str = "hvdk8s.grads",
    ) -> GradientReduction:
        """Validate Horovod's arguments with messages naming the argument.

        Raises:
            TypeError: ``sparse_as_dense`` is not True or False (or 1 or 0), ``process_set`` not a ``ProcessSet``,
                ``gradient_predivide_factor`` not a number, or ``compression`` neither a compressor nor a name.
            ValueError: ``op`` is not ``Average``, ``Sum`` or ``Adasum``; ``compression`` is an unknown name;
                ``groups`` is neither a positive count nor a list of variable lists; ``gradient_predivide_factor``
                is not above 0, or not 1.0 with an ``op`` other than ``Average``; or ``Adasum``'s limits.
        """
        _check_op(op, (Average, Sum, Adasum))
        if sparse_as_dense not in (True, False):  # == : 0 and 1 (argparse type=int, a config file), numpy bools
            raise TypeError(f"sparse_as_dense: expected True or False, got {type(sparse_as_dense).__name__} "
                            f"{sparse_as_dense!r}")
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_set: expected a hvdk8s.ProcessSet (hvdk8s.global_process_set, or one from "
                            f"hvdk8s.add_process_set), got {type(process_set).__name__} {process_set!r}")
        predivide = argcheck.real("gradient_predivide_factor", gradient_predivide_factor, above=0)
        if num_groups and groups is None:
            groups = num_groups  # Horovod's deprecated spelling of groups=int
        resolved = _resolve_groups(groups)
        if predivide != 1.0 and op != Average:  # Horovod refuses it too, with a ValueError
            raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor}: only applies to op=Average")
        if op == Adasum:
            _check_adasum(resolved, predivide)
        return cls(
            op=op,
            compression=resolve_compression(compression),
            sparse_as_dense=bool(sparse_as_dense),
            gradient_predivide_factor=predivide,
            groups=resolved,
            process_set=process_set,
            device_dense=device_dense,
            device_sparse=device_sparse,
            name=name,
        )


def _resolve_groups(groups: int | Sequence[Sequence[Any]] | None) -> int | tuple[frozenset, ...] | None:
    """Horovod's ``groups`` as ``GradientReduction`` holds it: a positive count, variable-key sets, or ``None``.

    A count must be positive: Horovod 0.28.1's ``DistributedOptimizer`` and
    ``DistributedGradientTape`` check ``isinstance(groups, list) or groups > 0``.
    """
    if groups is None:
        return None
    if isinstance(groups, numbers.Integral):
        if isinstance(groups, bool) or groups <= 0:  # Horovod refuses 0 too, with this message
            raise ValueError(f"groups={groups!r}: groups should be a non-negative integer or a list of list of "
                             "tf.Variable.")
        return int(groups)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
        raise ValueError(f"groups: expected a positive integer or a list of lists of variables, "
                         f"got {type(groups).__name__}")
    return tuple(frozenset(variable_key(v) for v in g) for g in groups)


def _check_adasum(groups: Any, predivide: float) -> None:
    """Adasum runs one allreduce per tensor: Horovod 0.28.1's grouped Adasum path fails.

    (``horovod.tensorflow.grouped_allreduce`` reads an undefined ``tensor`` for
    Adasum; its per-tensor ``allreduce`` works.) On CPU Horovod also needs a
    power-of-two number of ranks.
    """
    if groups is not None:
        raise ValueError("op=Adasum cannot be combined with groups: Horovod 0.28.1's grouped allreduce "
                         "fails for Adasum, so hvdk8s reduces each tensor on its own; pass groups=None")
    if predivide != 1.0:
        raise ValueError("op=Adasum does not take gradient_predivide_factor")
    if hvd.is_initialized() and not hvd.nccl_built() and hvd.size() & (hvd.size() - 1):
        raise ValueError(f"op=Adasum on CPU needs a power-of-two number of ranks, this job has {hvd.size()}")


def _scale_factors(reduction: GradientReduction) -> dict[str, float]:
    """Horovod's split of the average around the sum; its op adds 1/size for Average."""
    if reduction.op == Average:
        f = reduction.gradient_predivide_factor
        return {"prescale_factor": 1.0 / f, "postscale_factor": f}
    return {}


def _dense(reduction: GradientReduction, grad: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices) and not reduction.sparse_as_dense:
        return grad
    return tf.convert_to_tensor(grad)


def _reduce_one(reduction: GradientReduction, grad: Any, name: str) -> Any:
    """One gradient: a dense allreduce, or for ``IndexedSlices`` an allgather of values and indices."""
    if isinstance(grad, tf.IndexedSlices):
        if reduction.op == Adasum:
            raise ValueError("op=Adasum cannot reduce sparse gradients (IndexedSlices): pass sparse_as_dense=True")
        if reduction.gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor cannot apply to sparse gradients (IndexedSlices): "
                             "pass sparse_as_dense=True")
    return hvd.allreduce(
        grad, device_dense=reduction.device_dense, device_sparse=reduction.device_sparse,
        compression=reduction.compression, op=reduction.op, name=name,
        process_set=reduction.process_set, **_scale_factors(reduction),
    )


def _reduce_group(reduction: GradientReduction, grads: list[Any], name: str) -> list[Any]:
    if len(grads) == 1:
        return [_reduce_one(reduction, grads[0], name)]
    dense = [g for g in grads if not isinstance(g, tf.IndexedSlices)]
    reduced = iter(hvd.grouped_allreduce(
        dense, device_dense=reduction.device_dense, compression=reduction.compression, op=reduction.op,
        name=name, process_set=reduction.process_set, **_scale_factors(reduction),
    ) if dense else [])
    return [
        _reduce_one(reduction, g, f"{name}.sparse{i}") if isinstance(g, tf.IndexedSlices) else next(reduced)
        for i, g in enumerate(grads)
    ]


def _partition(reduction: GradientReduction, present: list[int], variables: Sequence[Any] | None) -> list[list[int]]:
    """Indices of the gradients, one list per allreduce op."""
    groups = reduction.groups
    if groups is None:
        return [[i] for i in present]
    if isinstance(groups, int):
        return [chunk for chunk in split_list(present, groups) if chunk]
    if variables is None:
        raise ValueError("groups given as variable lists need the variables: pass them to apply()/apply_gradients()")
    keys = {i: variable_key(variables[i]) for i in present}
    out, placed = [], set()
    for group in groups:
        members = [i for i in present if keys[i] in group and i not in placed]
        placed.update(members)
        if members:
            out.append(members)
    return out + [[i] for i in present if i not in placed]


def reduce_gradients(
    reduction: GradientReduction,
    grads: Sequence[Any],
    variables: Sequence[Any] | None = None,
) -> list[Any]:
    """Reduce one step's gradients across the ranks of ``reduction.process_set``.

    ``None`` gradients (variables the loss does not reach) stay ``None``; every
    rank has the same ones. Each allreduce op depends only on its own
    gradients, so in a compiled step TensorFlow starts it as soon as backprop
    has produced them, while earlier layers are still differentiating.
    ``commtime`` records the communication left exposed after the last
    gradient without ordering anything.
    """
    if not reduction.process_set.included():
        return [None if g is None else _dense(reduction, g) for g in grads]
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = {i: _dense(reduction, grads[i]) for i in present}
    out: list[Any] = [None] * len(grads)
    with tf.name_scope(reduction.name.replace(".", "_")):
        shared = runtime_size(reduction.process_set) > 1
        for n, members in enumerate(_partition(reduction, present, variables)):
            group = [dense[i] for i in members]
            name = f"{reduction.name}.{n}"
            if any(isinstance(g, tf.IndexedSlices) for g in group):
                reduced = _reduce_group(reduction, group, name)
            else:  # one rank: every op's result is its input
                reduced = tf.cond(shared, lambda g=group, m=name: _reduce_group(reduction, g, m), lambda g=group: g)
            for i, r in zip(members, reduced):
                out[i] = r
    commtime.record_exposed(list(dense.values()), [out[i] for i in present])
    return out


def runtime_size(process_set: Any = global_process_set) -> tf.Tensor:
    """The process set's size, read when the op runs (elastic jobs change it)."""
    return hvd.size_op(process_set_id=process_set.process_set_id)


def all_true(flag: Any, process_set: Any = global_process_set, name: str = "hvdk8s.all_true") -> tf.Tensor:
    """Whether a boolean tensor is true on every rank (one scalar allreduce; usable in a traced step)."""
    count = hvd.allreduce(tf.cast(flag, tf.int32), op=Sum, name=name, process_set=process_set)
    return tf.equal(count, runtime_size(process_set))


def _root_rank(root_rank: object, process_set: Any) -> int:
    """``root_rank`` as an int that is one of ``process_set``'s ranks: Horovod's broadcasts take a global rank.

    Before ``init`` only its type and sign are checked (Horovod then says it is not initialized).
    """
    rank = argcheck.whole("root_rank", root_rank, least=0)
    ranks = process_set.ranks if hvd.is_initialized() else None
    if ranks and rank not in ranks:
        span = f"0 to {len(ranks) - 1}" if ranks == list(range(len(ranks))) else f"{ranks}, global ranks as in Horovod"
        raise ValueError(f"root_rank={rank}: not a rank of the process set (size {len(ranks)}: ranks {span})")
    return rank


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0, process_set: Any = global_process_set) -> None:
    """Overwrite ``variables`` on every rank with their values on ``root_rank`` (one traced group of broadcasts).

    The broadcasts are named by position, not (as Horovod's ``broadcast_variables`` names them) by variable name:
    Horovod pairs collectives across ranks by name, and the same model's variables are named differently on a rank
    that loaded it (``hvdk8s.load_model`` of a Sequential: ``dense/kernel``) and on one that built it
    (``sequential/dense/kernel``), so a resumed job would wait forever at its first broadcast. So every rank must
    pass the same variables in the same order, with the same shapes and dtypes. An empty sequence does nothing
    (no collective runs). Unlike Horovod's, ``root_rank`` defaults to 0 and there is no ``inplace`` argument.

    Args:
        variables: The variables to overwrite: Keras variables (``model.variables``, ``optimizer.variables``)
            or ``tf.Variable``s, in the same order on every rank.
        root_rank: The rank whose values every rank takes.
        process_set: The Horovod process set to broadcast within; defaults to every rank of the job.

    Returns:
        Nothing; the variables are assigned in place.

    Raises:
        TypeError: ``root_rank`` is not a whole number.
        ValueError: ``root_rank`` is negative or not a rank of ``process_set``.
        tensorflow.errors.FailedPreconditionError: Horovod is not initialized (call ``hvdk8s.init()`` first).

    Example:
        ```python
        # a custom training loop: every rank starts from rank 0's weights and optimizer state
        optimizer.build(model.trainable_variables)
        hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
        ```
    """
    root_rank = _root_rank(root_rank, process_set)
    if variables:
        _broadcast_group([v.value if isinstance(v, keras.Variable) else v for v in variables], root_rank, process_set)


@tf.function
def _broadcast_group(values: list[Any], root_rank: int, process_set: Any) -> None:
    for i, value in enumerate(values):
        value.assign(hvd.broadcast(value, root_rank, name=f"hvdk8s_broadcast_variable_{i}", process_set=process_set))


def average_scalars(values: Mapping[str, float], name: str = "hvdk8s.metrics") -> dict[str, float]:
    """Average named scalars across ranks in one grouped allreduce.

    Keys are sorted so every rank feeds the same tensor order; all ranks must
    pass the same keys (they do for Keras logs of the same model and data).
    """
    keys = sorted(values)
    if not keys:
        return {}
    tensors = [tf.constant(float(values[k]), dtype=tf.float64) for k in keys]
    reduced = hvd.grouped_allreduce(tensors, op=Average, name=name)
    return {k: float(t.numpy()) for k, t in zip(keys, reduced)}


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set) -> Any:
    """Send a picklable Python object from ``root_rank`` to every rank (Horovod's ``broadcast_object``).

    Horovod pickles the object with cloudpickle on ``root_rank`` and broadcasts its size, then its bytes; the
    other ranks unpickle it. Every rank calls it; what the other ranks pass is ignored (``None`` will do).
    Horovod's TF1 ``session`` argument is not taken.

    Args:
        obj: On ``root_rank``, the object to send: anything cloudpickle can serialize.
        root_rank: The rank whose object every rank receives.
        name: A prefix for the names of the two broadcasts it runs; ``None`` uses the name of ``obj``'s type,
            as Horovod does.
        process_set: The Horovod process set to broadcast within; defaults to every rank of the job.

    Returns:
        ``root_rank``'s object: on ``root_rank`` the object passed in, on the others an unpickled copy.

    Raises:
        TypeError: ``root_rank`` is not a whole number.
        ValueError: ``root_rank`` is negative or not a rank of ``process_set``; or Horovod is not initialized
            (call ``hvdk8s.init()`` first).
    """
    return hvd.broadcast_object(obj, root_rank=_root_rank(root_rank, process_set), name=name, process_set=process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every rank's picklable object, in rank order (Horovod's ``allgather_object``).

    Horovod pickles each rank's object with cloudpickle, gathers the sizes and then the bytes from every rank,
    and unpickles them all on every rank. Horovod's TF1 ``session`` argument is not taken.

    Args:
        obj: This rank's object: anything cloudpickle can serialize.
        name: A prefix for the names of the two allgathers it runs; ``None`` uses the name of ``obj``'s type,
            as Horovod does.
        process_set: The Horovod process set to gather from; defaults to every rank of the job.

    Returns:
        A list with one object per rank of the process set, in rank order (this rank's own object included,
            as an unpickled copy).

    Raises:
        tensorflow.errors.FailedPreconditionError: Horovod is not initialized (call ``hvdk8s.init()`` first).
    """
    return hvd.allgather_object(obj, name=name, process_set=process_set)


# Horovod's Keras top-level collectives: eager values in, eager tensors out.


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Any = None,
    compression: Any = Compression.none,
) -> tf.Tensor:
    """Allreduce a tensor-compatible value (``horovod.tensorflow.keras.allreduce``).

    Every rank calls it with a value of the same shape and dtype, and every rank gets the same result. The value
    is first turned into a ``tf.constant``, as in Horovod's Keras ``allreduce``, so it takes concrete values (in
    eager code, or Python values inside a ``tf.function``) but not a symbolic tensor of a traced function; the
    reduction runs over every rank of the job (Horovod's Keras version takes no process set either).

    Args:
        value: What to reduce: anything ``tf.constant`` accepts (a number, a nested list, a NumPy array, an eager
            tensor).
        name: A name for that constant; it is not passed to Horovod's op.
        average: Horovod's deprecated switch, kept for old scripts: True means ``op=Average``, False
            ``op=Sum`` (Horovod warns with a ``DeprecationWarning``). Leave it ``None`` and use ``op``.
        prescale_factor: Horovod multiplies each rank's value by this before reducing.
        postscale_factor: Horovod multiplies the reduced result by this.
        op: How the ranks' values combine: ``hvdk8s.Average`` (what ``None`` means), ``hvdk8s.Sum`` or
            ``hvdk8s.Adasum``; Horovod's ``Min``, ``Max`` and ``Product`` (from ``horovod.tensorflow``) are
            passed through too.
        compression: How Horovod compresses the value on the wire: ``Compression.none`` or ``Compression.fp16``,
            or (an hvdk8s addition) their names ``"none"`` and ``"fp16"``.

    Returns:
        An eager ``tf.Tensor`` of the value's shape and dtype holding the reduced result, the same on every rank.

    Raises:
        TypeError: ``compression`` is neither a Horovod compressor nor a name (None, say).
        ValueError: ``op`` is not one of Horovod's op constants (a string, say); ``compression`` is a string
            other than ``"none"`` or ``"fp16"``; both ``average`` and ``op`` are given (Horovod's check); or
            Horovod is not initialized (call ``hvdk8s.init()`` first).

    Example:
        ```python
        hvd.init()
        mean_loss = float(hvd.allreduce(local_loss))  # the average of every rank's float
        correct, seen = hvd.allreduce([local_correct, local_seen], op=hvd.Sum).numpy()
        ```
    """
    if op is not None:
        _check_op(op, tuple(_OP_NAMES))
    return hvd.allreduce(
        tf.constant(value, name=name), average=average, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, op=op, compression=resolve_compression(compression),
    )


def allgather(value: Any, name: str | None = None) -> tf.Tensor:
    """Concatenate every rank's value along the first dimension (``hvd.allgather``).

    As in Horovod's Keras ``allgather``, the value becomes a ``tf.constant`` first and the gather runs over every
    rank of the job. The values must have the same dtype, the same number of dimensions (at least one) and the
    same sizes past the first on every rank; the first dimension may differ from rank to rank.

    Args:
        value: This rank's part: anything ``tf.constant`` accepts, with at least one dimension.
        name: A name for that constant; it is not passed to Horovod's op.

    Returns:
        An eager ``tf.Tensor`` holding every rank's value, rank 0's rows first: its first dimension is the sum of
            the ranks' first dimensions, the rest as in ``value``.

    Raises:
        tensorflow.errors.FailedPreconditionError: Horovod is not initialized (call ``hvdk8s.init()`` first),
            or ``value`` is a scalar.
    """
    return hvd.allgather(tf.constant(value, name=name))


def broadcast(value: Any, root_rank: int, name: str | None = None) -> tf.Tensor:
    """``root_rank``'s value on every rank (``hvd.broadcast``).

    As in Horovod's Keras ``broadcast``, the value becomes a ``tf.constant`` first and the broadcast runs over
    every rank of the job. Every rank passes a value of the same shape and dtype; only ``root_rank``'s is kept.
    To overwrite variables, use ``broadcast_variables``.

    Args:
        value: This rank's value: anything ``tf.constant`` accepts.
        root_rank: The rank whose value every rank receives.
        name: A name for that constant; it is not passed to Horovod's op.

    Returns:
        An eager ``tf.Tensor`` with ``root_rank``'s value, of the value's shape and dtype.

    Raises:
        TypeError: ``root_rank`` is not a whole number.
        ValueError: ``root_rank`` is negative or not below the job's size.
        tensorflow.errors.FailedPreconditionError: Horovod is not initialized (call ``hvdk8s.init()`` first).
    """
    return hvd.broadcast(tf.constant(value, name=name), _root_rank(root_rank, global_process_set))


def reducescatter(value: Any, name: str | None = None, op: Any = Average) -> tf.Tensor:
    """Reduce across ranks and give each rank its slice of the first dimension (``hvd.reducescatter``).

    As in Horovod's Keras ``reducescatter``, the value becomes a ``tf.constant`` first and the operation runs over
    every rank of the job. Every rank passes a value of the same shape and dtype, with at least one dimension;
    the reduced result is split along its first dimension into one contiguous slice per rank, in rank order.
    When the ranks do not divide that dimension evenly, the first ranks get one row more.

    Args:
        value: This rank's value: anything ``tf.constant`` accepts, with at least one dimension.
        name: A name for that constant; it is not passed to Horovod's op.
        op: ``hvdk8s.Average`` or ``hvdk8s.Sum``, the only reductions Horovod's reducescatter supports.

    Returns:
        An eager ``tf.Tensor`` with this rank's slice of the reduced value: the value's dtype and shape, except
            for the first dimension.

    Raises:
        ValueError: ``op`` is not one of Horovod's op constants (a string, say).
        tensorflow.errors.FailedPreconditionError: Horovod is not initialized (call ``hvdk8s.init()`` first).
        tensorflow.errors.AbortedError: ``op`` is another of Horovod's ops (``Adasum``, ``Min`` ...).
    """
    _check_op(op, tuple(_OP_NAMES))
    return hvd.reducescatter(tf.constant(value, name=name), op=op)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF1 ``broadcast_global_variables``, which Horovod itself refuses under eager TF2.

    Keras 3 has no global variable collection: refused with what to use instead. In ``fit``, that is
    ``hvdk8s.callbacks.BroadcastGlobalVariablesCallback(root_rank)``; in a custom loop,
    ``hvdk8s.broadcast_variables(model.variables + optimizer.variables, root_rank)``.

    Args:
        root_rank: In Horovod, the rank whose global variables every rank would take; not used here.

    Raises:
        RuntimeError: Always, naming those two replacements.
    """
    raise RuntimeError(
        "broadcast_global_variables: Keras 3 and TF2 have no global variables collection; use "
        "hvdk8s.callbacks.BroadcastGlobalVariablesCallback(root_rank) in fit, or "
        "hvdk8s.broadcast_variables(model.variables + optimizer.variables, root_rank) in a custom loop"
    )
