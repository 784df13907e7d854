"""What the REST and gRPC front ends share: the models, their versions, and one way to run them.

Both APIs resolve a model spec (name, version or label) against the same
``Models`` and hand their decoded input arrays to the same executor — the
``Batcher`` (on by default) or ``Unbatched`` — so a REST and a gRPC request
can share a batch and both see the same errors. Classify and Regress
(``classify_regress``) run through the same executor, their serialized
``tf.Example`` vector as the signature's one input.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import numpy as np

from hvdk8s.serving.api import classify_regress, rest
from hvdk8s.serving.server.batching import Batcher, BatchingParameters, Unbatched
from hvdk8s.serving.server.monitoring import Metrics
from hvdk8s.serving.server.registry import Models
from hvdk8s.serving.server.repository import ModelRepository, Servable


class ServingCore:
    def __init__(self, models: Models | ModelRepository, batching: BatchingParameters | None = BatchingParameters(),
                 metrics: Metrics | None = None):
        self.models = models if isinstance(models, Models) else Models.of(models)
        self.batching = batching
        self.metrics = metrics  # both front ends count their requests here (--monitoring_config_file)
        self.executor: Batcher | Unbatched = Batcher(batching, _run) if batching else Unbatched(_run)

    def servable(self, model: str, version: int | None = None, label: str | None = None) -> Servable:
        """The version a request addresses (by number, label, or the newest)."""
        return self.models.get(model, version, label)

    def status(self, model: str, version: int | None = None) -> dict:
        """GetModelStatusResponse as JSON (TF Serving's REST answer; gRPC parses it into the message).

        Takes no version label: TF Serving's ``GetModelStatusWithModelSpec``
        (model_servers/get_model_status_impl.cc) looks only at the spec's
        version, so a status request by label, known or not, answers every
        version of the model.
        """
        return rest.status_response(self.models.status(model, version))

    def submit(self, servable: Servable, signature: str, inputs: Mapping[str, np.ndarray]) -> Future:
        """The future outputs of one predict call (batched with others when batching is on)."""
        servable.check(signature, inputs)  # refused here, the request never joins a batch
        return self.executor.submit(servable, signature, inputs)

    def submit_async(self, servable: Servable, signature: str, inputs: Mapping[str, np.ndarray]) -> asyncio.Future:
        """``submit`` for a caller on the running event loop (the REST server)."""
        servable.check(signature, inputs)
        return self.executor.submit_async(servable, signature, inputs)

    def examples_inputs(self, api: str, servable: Servable, signature: str,
                        serialized: Sequence[bytes]) -> dict[str, np.ndarray]:
        """Classify or Regress: the signature checked, then the inputs that run it like a predict call."""
        classify_regress.check_signature(api, signature, servable.signature_defs)
        return classify_regress.input_tensor(serialized)

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
