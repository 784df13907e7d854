"""What the REST and gRPC front ends share: the model versions and one way to run them.

Both APIs resolve a model spec (name, version or label) against the same
``ModelRepository`` and hand their decoded input arrays to the same
executor — the ``Batcher`` (on by default) or ``Unbatched`` — so a REST and
a gRPC request can share a batch and both see the same errors.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from concurrent.futures import Future

import numpy as np

from hvdk8s.serving import rest
from hvdk8s.serving.batching import Batcher, BatchingParameters, Unbatched
from hvdk8s.serving.repository import ModelRepository, Servable


class ServingCore:
    def __init__(self, repository: ModelRepository, batching: BatchingParameters | None = BatchingParameters()):
        self.repository = repository
        self.batching = batching
        self.executor: Batcher | Unbatched = Batcher(batching, _run) if batching else Unbatched(_run)

    def servable(self, model: str, version: int | None = None, label: str | None = None) -> Servable:
        """The version a request addresses; labels need a model config file, which this server has not."""
        if label is not None:
            raise rest.unknown_label(label)
        return self.repository.get(model, version)

    def status(self, model: str, version: int | None = None, label: str | None = None) -> dict:
        if label is not None:
            raise rest.unknown_label(label)
        return rest.status_response(self.repository.status(model, version))

    def submit(self, servable: Servable, signature: str, inputs: Mapping[str, np.ndarray]) -> Future:
        """The future outputs of one predict call (batched with others when batching is on)."""
        servable.check(signature, inputs)  # refused here, the request never joins a batch
        return self.executor.submit(servable, signature, inputs)

    def submit_async(self, servable: Servable, signature: str, inputs: Mapping[str, np.ndarray]) -> asyncio.Future:
        """``submit`` for a caller on the running event loop (the REST server)."""
        servable.check(signature, inputs)
        return self.executor.submit_async(servable, signature, inputs)

    def close(self) -> None:
        self.executor.close()


def tensorflow_threads(batching: BatchingParameters | None, intra_op: int | None = None) -> int:
    """TensorFlow's intra-op thread count for a server (TF Serving's ``--tensorflow_intra_op_parallelism``).

    ``intra_op`` given (0: TensorFlow picks) is used as is. Otherwise, with
    batching, each batch thread gets an equal share of the cores (one core
    each with the default ``num_batch_threads``, the core count): batches
    then run side by side instead of every op's threads contending for all
    cores with the other batch threads' ops. Without batching: TensorFlow's
    own choice.
    """
    if intra_op is not None:
        return intra_op
    if batching is None:
        return 0
    return max(1, (os.cpu_count() or 1) // batching.num_batch_threads)


def _run(servable: Servable, signature: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return servable.run(signature, inputs)
