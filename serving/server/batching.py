"""Server-side batching with TensorFlow Serving's parameters and semantics, shared by REST and gRPC.

Requests for the same model version, signature and input shapes wait in one
queue; a batch thread takes up to ``max_batch_size`` examples from it, as
soon as that many are waiting or the oldest has waited
``batch_timeout_micros`` (0: whatever is waiting when a thread is free —
under load, requests pile up while the threads are busy, so batches form by
themselves). A request of more than ``max_batch_size`` examples is refused,
as TF Serving refuses it; with ``enable_large_batch_splitting`` batches
hold at most ``max_execution_batch_size`` examples and a request that does
not fit the batch being filled is split to fill it, the rest going into the
next ones (TF Serving's ``SplitInputTask``), its answer joined from the
pieces'. The inputs are concatenated along the batch dimension, padded
up to the next of ``allowed_batch_sizes`` with copies of the first example
(and, with ``pad_variable_length_inputs``, other dimensions padded with each
tensor's first value, as TF Serving does), run once, and the outputs are
split back. If a batch fails, each of its requests is run again on its own,
so one bad request fails only itself.

Callers on an event loop (the REST server) use ``submit_async``: the
requests one pass of the loop produces join the queue together under one
lock, waking a batch thread per batch they fill, and a batch's answers
return to the loop in one callback; per request, a thread-safe future and
its hand-off to the loop would cost each a lock and a wake-up.

``--batching_parameters_file`` is TF Serving's text-format
``BatchingParameters`` proto, parsed by protobuf's ``text_format`` against
that message (rebuilt here from session_bundle_config.proto, which
``tensorflow-serving-api`` does not ship).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from hvdk8s.common.fields import FieldError, SpecError, at_least, invalid
from hvdk8s.serving.api import types

log = logging.getLogger("hvdk8s.serving")
Outputs = dict[str, np.ndarray]
Run = Callable[[Any, str, Mapping[str, np.ndarray]], Outputs]
"""(servable, signature name, named inputs) -> named outputs; raises ``types.ServingError``."""
Outcome = Outputs | BaseException


@dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's BatchingParameters fields that ``hvdk8s serve`` implements, with TF Serving's defaults.

    A field left out of TF Serving's file keeps its batch scheduler's default
    (``SharedBatchScheduler::QueueOptions`` in TensorFlow's
    ``core/kernels/batching_util/shared_batch_scheduler.h``: input batch size
    limit 1000, no added wait, 10 enqueued batches, no splitting; one batch
    thread per core). No added wait (``batch_timeout_micros`` 0) means a lone
    request is never delayed: batches form from the requests that arrive
    while the model is busy.
    """

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    num_batch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_enqueued_batches: int = 10
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int | None = None  # with splitting, the largest batch run (None: max_batch_size)

    @property
    def batch_limit(self) -> int:
        """The most examples one batch runs."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size is not None:
            return self.max_execution_batch_size
        return self.max_batch_size

    def __post_init__(self) -> None:
        if errors := validate(self):
            raise BatchingParametersError("batching parameters", errors)


class BatchingParametersError(SpecError, ValueError):
    """Batching parameters TF Serving would refuse, every problem under its field's name (the file's too).

    Also a ``ValueError``, which its callers caught before the errors were collected.
    """


def validate(params: BatchingParameters) -> list[FieldError]:
    """Every problem of ``params``, each under its field's name, which TF Serving's file spells the same."""
    errors: list[FieldError] = []
    for name in ("max_batch_size", "num_batch_threads", "max_enqueued_batches"):
        errors += at_least(name, getattr(params, name), 1)
    errors += at_least("batch_timeout_micros", params.batch_timeout_micros, 0)
    largest = f"max_batch_size ({params.max_batch_size})"
    execution = params.max_execution_batch_size
    if execution is not None and not 1 <= execution <= params.max_batch_size:
        # session_bundle_config.proto: max_batch_size should be at least max_execution_batch_size
        errors.append(invalid("max_execution_batch_size", f"{execution} must be between 1 and {largest}"))
    sizes = params.allowed_batch_sizes
    if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != params.max_batch_size or sizes[0] < 1):
        # TF Serving's rule (session_bundle_config.proto)
        errors.append(invalid("allowed_batch_sizes", f"{list(sizes)} must be positive, increasing and end with {largest}"))
    return errors


def parse_parameters(text: str, source: str = "batching parameters") -> BatchingParameters:
    """``BatchingParameters`` from TF Serving's text format, e.g. ``max_batch_size { value: 32 }``.

    Unknown fields and malformed text are errors naming the line (protobuf's
    strict parser); fields left out keep TF Serving's defaults.
    ``thread_pool_name`` is accepted and has no effect: one server has one
    pool.
    """
    from hvdk8s.serving.server import textproto

    message = textproto.parse(text, _message_class()(), source)
    given: dict[str, Any] = {}
    for f in fields(BatchingParameters):
        if f.name == "allowed_batch_sizes":
            if message.allowed_batch_sizes:
                given[f.name] = tuple(message.allowed_batch_sizes)
        elif f.name == "pad_variable_length_inputs":
            given[f.name] = message.pad_variable_length_inputs
        elif message.HasField(f.name):
            given[f.name] = getattr(message, f.name).value
    try:
        return BatchingParameters(**given)
    except BatchingParametersError as err:
        raise BatchingParametersError(source, err.field_errors) from None


def read_parameters_file(path: str | os.PathLike[str]) -> BatchingParameters:
    from hvdk8s.serving.server import textproto

    return parse_parameters(*textproto.read(path, "--batching_parameters_file"))


def _message_class() -> type:
    """tensorflow.serving.BatchingParameters, built from its field list (session_bundle_config.proto)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="hvdk8s/batching_parameters.proto", package="tensorflow.serving", syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    msg = proto.message_type.add(name="BatchingParameters")
    F = descriptor_pb2.FieldDescriptorProto
    for name, number, wrapper in [
        ("max_batch_size", 1, "Int64Value"), ("batch_timeout_micros", 2, "Int64Value"),
        ("max_enqueued_batches", 3, "Int64Value"), ("num_batch_threads", 4, "Int64Value"),
        ("thread_pool_name", 5, "StringValue"), ("enable_large_batch_splitting", 8, "BoolValue"),
        ("max_execution_batch_size", 9, "Int64Value"),
    ]:
        msg.field.add(name=name, number=number, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                      type_name=f".google.protobuf.{wrapper}")
    msg.field.add(name="allowed_batch_sizes", number=6, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    msg.field.add(name="pad_variable_length_inputs", number=7, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


@dataclass(eq=False)
class _Task:
    servable: Any
    signature: str
    inputs: Mapping[str, np.ndarray]
    size: int
    alone: bool  # runs as a batch of its own
    future: Future | asyncio.Future
    loop: asyncio.AbstractEventLoop | None = None  # the loop that owns an asyncio future
    enqueued: float = field(default_factory=time.monotonic)
    whole: Future | asyncio.Future | None = None  # a piece's: the future of the request it was split from

    def cancelled(self) -> bool:
        """Its caller gave up (a gRPC deadline, a REST timeout), on this request or on the one it is a piece of."""
        return self.future.cancelled() or (self.whole is not None and self.whole.cancelled())


class Batcher:
    """Queues requests and runs them in batches on ``num_batch_threads`` threads."""

    def __init__(self, params: BatchingParameters, run: Run):
        self.params = params
        self._run = run
        self._cv = threading.Condition()
        self._queues: dict[tuple, deque[_Task]] = {}
        self._waiting: dict[tuple, int] = {}  # examples in each queue, kept as tasks come and go (not summed per request)
        self._pending: dict[asyncio.AbstractEventLoop, list[_Task]] = {}  # submit_async's, until the loop's pass ends
        self._closed = False
        self.batches = 0  # batches run and the requests in them (logged at close: the mean batch size)
        self.tasks = 0
        self._threads = [
            threading.Thread(target=self._loop, name=f"batch-{i}", daemon=True)
            for i in range(params.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, servable: Any, signature: str, inputs: Mapping[str, np.ndarray]) -> Future:
        """The future of one request's outputs (or its ``types.ServingError``), for a caller on any thread."""
        future: Future = Future()
        task = self._task(servable, signature, inputs, future)
        with self._cv:
            _, before = self._enqueue(task)
            self._cv.notify(1 if task.alone else _batches_touched(before, task.size, self.params.batch_limit))
        return future

    def submit_async(self, servable: Any, signature: str, inputs: Mapping[str, np.ndarray]) -> asyncio.Future:
        """``submit`` for a caller on the running event loop; the request is queued when this pass of the loop ends.

        Errors found before queueing (an oversized request) are raised;
        those of queueing (a full queue, shutdown) come as the future's.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        task = self._task(servable, signature, inputs, future, loop)
        pending = self._pending.setdefault(loop, [])  # touched only by its own loop's thread
        if not pending:
            loop.call_soon(self._flush, loop)
        pending.append(task)
        return future

    def _task(self, servable: Any, signature: str, inputs: Mapping[str, np.ndarray],
              future: Future | asyncio.Future, loop: asyncio.AbstractEventLoop | None = None) -> _Task:
        sizes = {a.shape[0] if a.ndim else -1 for a in inputs.values()}
        size = sizes.pop() if len(sizes) == 1 else -1
        if size > self.params.max_batch_size:  # TF Serving's words (shared_batch_scheduler.h), split or not
            raise types.invalid(f"Task size {size} is larger than maximum input batch size {self.params.max_batch_size}")
        alone = size < 1  # no common batch dimension, or an empty batch: nothing to merge
        return _Task(servable, signature, inputs, max(size, 1), alone, future, loop)

    def _enqueue(self, task: _Task) -> tuple[tuple, int]:
        """Queue ``task`` (holding the lock): its queue's key and the examples that queue held before, or raise
        why not."""
        if self._closed:
            raise types.ServingError("UNAVAILABLE", "the server is shutting down")
        key = (id(task.servable), task.signature, self._shape_key(task.inputs))
        queue = self._queues.setdefault(key, deque())
        waiting, limit = self._waiting.get(key, 0), self.params.batch_limit
        if waiting + task.size > self.params.max_enqueued_batches * limit:
            raise types.ServingError(
                "UNAVAILABLE", "The batch scheduling queue to which this task was submitted is full"
            )
        room = limit - waiting % limit  # in the batch being filled
        if self.params.enable_large_batch_splitting and not task.alone and task.size > room:
            queue.extend(_pieces(task, room, limit))
        else:
            queue.append(task)
        self._waiting[key] = waiting + task.size
        return key, waiting

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Queue what ``submit_async`` collected in one pass of ``loop``.

        Wakes a batch thread for every batch it adds examples to, and for
        every request that runs alone.
        """
        tasks = [t for t in self._pending.pop(loop) if not t.future.done()]  # not those cancelled meanwhile
        added: dict[tuple, list[int]] = {}  # each queue's examples before this pass, and those it added
        batches = 0
        with self._cv:
            for task in tasks:
                try:
                    key, before = self._enqueue(task)
                except types.ServingError as err:  # its traceback holds this frame, and with it the futures
                    _settle(task.future, err.detached())
                    continue
                if task.alone:
                    batches += 1
                else:
                    added.setdefault(key, [before, 0])[1] += task.size
            batches += sum(_batches_touched(before, n, self.params.batch_limit) for before, n in added.values())
            if batches:
                self._cv.notify(batches)

    def close(self) -> None:
        """Run what is queued, then stop the threads."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join()
        if self.batches:
            log.info("batching: %d requests in %d batches (%.1f requests per batch)",
                     self.tasks, self.batches, self.tasks / self.batches)

    def _shape_key(self, inputs: Mapping[str, np.ndarray]) -> tuple:
        if self.params.pad_variable_length_inputs:
            return tuple((name, a.dtype.str, a.ndim) for name, a in sorted(inputs.items()))
        return tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(inputs.items()))

    def _loop(self) -> None:
        while True:
            with self._cv:
                batch = self._next_batch()
            if batch is None:
                return
            self._execute(batch)

    def _next_batch(self) -> list[_Task] | None:
        """Wait for a batch that is full or due; None once closed and drained (holding the lock)."""
        timeout = self.params.batch_timeout_micros / 1e6
        while True:
            now, wait, ready = time.monotonic(), None, None
            for key, queue in self._queues.items():
                if not queue:
                    continue
                due = queue[0].enqueued + timeout
                full = queue[0].alone or self._waiting[key] >= self.params.batch_limit
                if full or due <= now or self._closed:
                    if ready is None or queue[0].enqueued < self._queues[ready][0].enqueued:
                        ready = key
                else:
                    wait = due - now if wait is None else min(wait, due - now)
            if ready is not None:
                batch = self._take(self._queues[ready])
                self._waiting[ready] -= sum(t.size for t in batch)
                return batch
            if self._closed:
                return None
            self._cv.wait(wait)

    def _take(self, queue: deque[_Task]) -> list[_Task]:
        batch = [queue.popleft()]
        if batch[0].alone:
            return batch
        total = batch[0].size
        while queue and not queue[0].alone and total + queue[0].size <= self.params.batch_limit:
            total += queue[0].size
            batch.append(queue.popleft())
        return batch

    def _execute(self, batch: list[_Task]) -> None:
        batch = [task for task in batch if not task.cancelled()]  # callers that gave up (a gRPC deadline)
        if not batch:
            return
        self.batches += 1
        self.tasks += len(batch)
        _finish(zip(batch, self._outcomes(batch)))

    def _outcomes(self, batch: list[_Task]) -> list[Outcome]:
        """Each task's outputs or exception: the batch run once, or each task alone if the batch failed."""
        first = batch[0]
        if len(batch) == 1 and first.alone:
            return [self._alone(first)]
        try:
            merged, rows = self._merge(batch)
            parts = _split(self._run(first.servable, first.signature, merged), [t.size for t in batch], rows)
        except types.ServingError:
            parts = None
        except Exception as err:  # noqa: BLE001  (an unexpected failure goes to every caller)
            return [err] * len(batch)
        if parts is None:  # the batch failed, or its outputs cannot be split: one call each
            return [self._alone(task) for task in batch]
        return list(parts)

    def _alone(self, task: _Task) -> Outcome:
        """One request run on its own."""
        try:
            return self._run(task.servable, task.signature, task.inputs)
        except types.ServingError as err:  # an answer, not a bug: its traceback reaches this frame's task and future
            return err.detached()
        except Exception as err:  # noqa: BLE001  (a bug: it goes to this caller, traceback and all, for the log)
            return err

    def _merge(self, batch: Sequence[_Task]) -> tuple[dict[str, np.ndarray], int]:
        """The batch's inputs concatenated (and padded), and the number of rows they have."""
        total = sum(t.size for t in batch)
        target = next((s for s in self.params.allowed_batch_sizes if s >= total), total)
        merged = {}
        for name in batch[0].inputs:
            arrays = [t.inputs[name] for t in batch]
            if self.params.pad_variable_length_inputs:
                arrays = _pad_to_common_shape(arrays)
            if target > total:  # up to an allowed size, with copies of the first example
                arrays.append(np.repeat(arrays[0][:1], target - total, axis=0))
            merged[name] = np.concatenate(arrays)
        return merged, target


class Unbatched:
    """The same interface without batching: each request is one model call, on a thread pool."""

    def __init__(self, run: Run, threads: int | None = None):
        self._pool = ThreadPoolExecutor(max_workers=threads or min(32, (os.cpu_count() or 1) + 4),
                                        thread_name_prefix="predict")
        self._run = run

    def submit(self, servable: Any, signature: str, inputs: Mapping[str, np.ndarray]) -> Future:
        return self._pool.submit(self._run, servable, signature, inputs)

    def submit_async(self, servable: Any, signature: str, inputs: Mapping[str, np.ndarray]) -> asyncio.Future:
        return asyncio.wrap_future(self.submit(servable, signature, inputs))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _finish(settled: Iterable[tuple[_Task, Outcome]]) -> None:
    """Settle the tasks' futures: thread callers' at once, each event loop's in one callback."""
    by_loop: dict[asyncio.AbstractEventLoop | None, list[tuple[Future | asyncio.Future, Outcome]]] = {}
    for task, outcome in settled:
        by_loop.setdefault(task.loop, []).append((task.future, outcome))
    for loop, items in by_loop.items():
        if loop is None:
            _settle_all(items)
            continue
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for these answers
            loop.call_soon_threadsafe(_settle_all, items)


def _settle_all(items: list[tuple[Future | asyncio.Future, Outcome]]) -> None:
    """Settle each future; one that refuses its outcome gets an error instead, and the others still settle.

    (An asyncio future refuses ``StopIteration``, for one; raised on a batch
    thread, the refusal would also end the thread.)
    """
    for future, outcome in items:
        try:
            _settle(future, outcome)
        except Exception as err:  # noqa: BLE001  (logged, and the caller gets it rather than waiting forever)
            log.exception("batching: a request's %s could not be handed back", type(outcome).__name__)
            with contextlib.suppress(Exception):
                future.set_exception(RuntimeError(f"the request's outcome ({outcome!r:.200}) could not be handed "
                                                  f"back: {err}"))


def _settle(future: Future | asyncio.Future, outcome: Outcome) -> None:
    """Settle ``future`` unless it was cancelled (a caller's choice, or its event loop shutting down)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except (asyncio.InvalidStateError, InvalidStateError):
        if not future.cancelled():
            raise


def _pieces(task: _Task, room: int, limit: int) -> list[_Task]:
    """TF Serving's ``SplitInputTask``: ``room`` examples of ``task`` to fill the batch being filled, then pieces
    of at most ``limit``; each piece settles its share of ``task``'s answer (``_Joined``)."""
    bounds = [0, *range(room, task.size, limit), task.size]
    joined = _Joined(task, len(bounds) - 1)
    return [_Task(task.servable, task.signature, {name: a[lo:hi] for name, a in task.inputs.items()}, hi - lo, False,
                  joined.piece(i), enqueued=task.enqueued, whole=task.future)
            for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]


def _batches_touched(before: int, added: int, limit: int) -> int:
    """The batches of ``limit`` examples that ``added`` examples queued behind ``before`` reach: each needs a batch
    thread (a split request's pieces run side by side, not one after another on one thread)."""
    return -(-(before + added) // limit) - before // limit


class _Joined:
    """A split request's answer: its pieces' outputs joined along the batch dimension, or a piece's error."""

    def __init__(self, task: _Task, count: int):
        self._task = task
        self._parts: list[Outcome | None] = [None] * count
        self._left = count
        self._lock = threading.Lock()  # pieces may finish on different batch threads

    def piece(self, index: int) -> Future:
        future: Future = Future()
        future.add_done_callback(lambda done: self._done(index, done))
        return future

    def _done(self, index: int, future: Future) -> None:
        with self._lock:
            self._parts[index] = future.exception() or future.result()
            self._left -= 1
            if self._left:
                return
        outcome = next((p for p in self._parts if isinstance(p, BaseException)), None) or _join(self._parts)
        _finish([(self._task, outcome)])


def _join(parts: Sequence[Any]) -> Outcome:
    """The pieces' outputs concatenated; TF Serving's error (batching_session.cc) for an output with no batch
    dimension."""
    if any(np.ndim(v) == 0 for part in parts for v in part.values()):
        return types.ServingError("FAILED_PRECONDITION", "Batched output tensor has 0 dimensions")
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _split(outputs: Mapping[str, np.ndarray], sizes: list[int], rows: int) -> list[Outputs] | None:
    """Each task's rows of every output; None if an output's first dimension is not the batch."""
    if any(np.ndim(v) == 0 or np.shape(v)[0] != rows for v in outputs.values()):
        return None
    bounds = np.cumsum([0, *sizes])
    return [{k: np.asarray(v)[bounds[i]:bounds[i + 1]] for k, v in outputs.items()} for i in range(len(sizes))]


def _pad_to_common_shape(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Pad every non-batch dimension to the largest, with each tensor's first value (TF Serving's PadTensor)."""
    widest = np.max([a.shape for a in arrays], axis=0)
    padded = []
    for a in arrays:
        pads = [(0, 0)] + [(0, int(w - d)) for w, d in zip(widest[1:], a.shape[1:])]
        if a.size and any(after for _, after in pads):
            a = np.pad(a, pads, mode="constant", constant_values=a.flat[0])
        padded.append(a)
    return padded
