"""Server-side batching (serving/server/batching.py): TF Serving's parameter file, batch forming, isolation of failures.

A stand-in model (NumPy, no TensorFlow) records every batch it runs, so the
tests see exactly what was merged, padded and split.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hvdk8s.serving.api import types
from hvdk8s.serving.kube.manifests import batching_parameters_text
from hvdk8s.serving.kube.options import Batching
from hvdk8s.serving.server.batching import (
    Batcher,
    BatchingParameters,
    BatchingParametersError,
    parse_parameters,
    read_parameters_file,
    validate,
)


class Model:
    """y = 2x + row sum; an input containing -1 is "malformed" and fails the whole call, as a bad image would."""

    def __init__(self, gate: threading.Event | None = None):
        self.batches: list[int] = []
        self.gate = gate
        self.lock = threading.Lock()

    def __call__(self, servable, signature, inputs):
        x = inputs["x"]
        with self.lock:
            self.batches.append(len(x))
        if self.gate is not None:
            self.gate.wait(30)
        if (x == -1).any():
            raise types.invalid("malformed input")
        return {"y": 2 * x, "total": x.reshape(len(x), -1).sum(axis=1)}


def wait_until(condition, what: str, seconds: float = 30) -> None:
    """Poll ``condition`` (every 10 ms) until true; fail naming ``what`` instead of hanging."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.01)


def queued(batcher: Batcher) -> int:
    return sum(len(q) for q in batcher._queues.values())


def submit_all(batcher: Batcher, arrays: list[np.ndarray]) -> list:
    """Submit every request from its own thread at once; each one's result or exception."""
    def one(x):
        try:
            return batcher.submit("servable", "serving_default", {"x": x}).result(timeout=30)
        except types.ServingError as err:
            return err

    with ThreadPoolExecutor(len(arrays)) as pool:
        return list(pool.map(one, arrays))


def behind_a_busy_thread(batcher: Batcher, model: Model, gate: threading.Event, first: np.ndarray,
                         arrays: list[np.ndarray], entries: int | None = None) -> tuple[dict, list]:
    """Run ``first`` alone (the model blocks on ``gate``), queue ``arrays`` behind it, then release the model.

    Returns the first request's result and each queued one's result or exception. ``entries``: the queue
    entries they make (one each unless split).
    """
    blocker = batcher.submit("servable", "serving_default", {"x": first})  # holds the only batch thread
    wait_until(lambda: model.batches, "the first request to start")  # before the others can join its batch
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(submit_all(batcher, arrays)))
    runner.start()
    wait_until(lambda: queued(batcher) == (entries or len(arrays)), "all requests queued behind the busy thread")
    gate.set()
    runner.join(30)
    return blocker.result(30), results


def test_tf_serving_parameter_file_as_hvdk8s_renders_it_for_kubernetes(tmp_path):
    """The file ``hvdk8s serving-manifests --batching`` writes for TF Serving configures this server the same."""
    rendered = Batching(max_batch_size=64, batch_timeout_micros=500, num_batch_threads=3, max_enqueued_batches=7)
    (path := tmp_path / "batching_parameters.txt").write_text(batching_parameters_text(rendered))
    params = read_parameters_file(path)
    assert (params.max_batch_size, params.batch_timeout_micros, params.num_batch_threads,
            params.max_enqueued_batches) == (64, 500, 3, 7)


def test_every_field_of_the_text_format():
    text = """
        max_batch_size { value: 8 }
        batch_timeout_micros { value: 0 }
        thread_pool_name { value: "model_server_batch_threads" }
        allowed_batch_sizes: 2
        allowed_batch_sizes: 4
        allowed_batch_sizes: 8
        pad_variable_length_inputs: true
        enable_large_batch_splitting { value: false }
        max_execution_batch_size { value: 8 }
    """
    params = parse_parameters(text)
    assert params.allowed_batch_sizes == (2, 4, 8) and params.pad_variable_length_inputs
    assert not params.enable_large_batch_splitting and params.max_execution_batch_size == 8
    assert parse_parameters("") == BatchingParameters()  # fields left out keep the defaults


@pytest.mark.parametrize(
    "text, message",
    [
        ("max_batch_size: 8", 'f.txt: 1:17 : \'max_batch_size: 8\': Expected "{".'),
        ("max_batch_size { value: 8 }\nbatch_size { value: 4 }", 'f.txt: 2:1 : Message type '
         '"tensorflow.serving.BatchingParameters" has no field named "batch_size".'),
        ("max_batch_size { value: eight }", "f.txt: 1:25 : "),
        ("allowed_batch_sizes: 4\nallowed_batch_sizes: 2", "allowed_batch_sizes: [4, 2] must be positive, increasing"),
        ("max_batch_size { value: 8 }\nallowed_batch_sizes: 4", "end with max_batch_size (8)"),
        ("num_batch_threads { value: 0 }", "f.txt: invalid:\n  num_batch_threads: must be >= 1, got 0"),
        ("max_batch_size { value: 4 }\nmax_execution_batch_size { value: 8 }",
         "max_execution_batch_size: 8 must be between 1 and max_batch_size (4)"),
    ],
)
def test_malformed_parameter_files_name_the_line(text, message):
    with pytest.raises(ValueError) as err:
        parse_parameters(text, source="f.txt")
    assert str(err.value).startswith("f.txt") and message in str(err.value)


BAD_PARAMETERS = """
    max_batch_size { value: 4 }
    num_batch_threads { value: 0 }
    max_enqueued_batches { value: 0 }
    batch_timeout_micros { value: -5 }
    max_execution_batch_size { value: 8 }
    allowed_batch_sizes: 4
    allowed_batch_sizes: 2
"""
BAD_PARAMETERS_ERRORS = [
    "num_batch_threads: must be >= 1, got 0",
    "max_enqueued_batches: must be >= 1, got 0",
    "batch_timeout_micros: must be >= 0, got -5",
    "max_execution_batch_size: 8 must be between 1 and max_batch_size (4)",
    "allowed_batch_sizes: [4, 2] must be positive, increasing and end with max_batch_size (4)",
]


def test_every_bad_parameter_is_reported_at_once_under_its_field():
    with pytest.raises(BatchingParametersError) as err:
        parse_parameters(BAD_PARAMETERS, source="f.txt")
    assert err.value.errors == BAD_PARAMETERS_ERRORS
    assert str(err.value) == "f.txt: invalid:\n  " + "\n  ".join(BAD_PARAMETERS_ERRORS)
    assert isinstance(err.value, ValueError)  # what callers caught before the errors were collected
    assert [e.kind for e in err.value.field_errors] == ["Invalid"] * 5
    with pytest.raises(BatchingParametersError) as built:  # API callers get the same list
        BatchingParameters(max_batch_size=0, num_batch_threads=0, batch_timeout_micros=-1)
    assert str(built.value) == ("batching parameters: invalid:\n  max_batch_size: must be >= 1, got 0\n"
                                "  num_batch_threads: must be >= 1, got 0\n  batch_timeout_micros: must be >= 0, got -1")
    assert validate(BatchingParameters()) == []


def test_serve_lists_every_bad_parameter_of_the_file_without_a_traceback(tmp_path, capsys):
    import hvdk8s.cli

    (path := tmp_path / "batching.txt").write_text(BAD_PARAMETERS)
    argv = ["serve", str(tmp_path), "--enable_batching=true", "--batching_parameters_file", str(path)]
    assert hvdk8s.cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"hvdk8s serve: error: --batching_parameters_file {path}: invalid:\n  "
                   + "\n  ".join(BAD_PARAMETERS_ERRORS) + "\n")


def test_concurrent_requests_share_batches_and_get_their_own_rows():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(BatchingParameters(max_batch_size=8, num_batch_threads=1), model)
    arrays = [np.array([[i, i + 0.5]] * (1 + i % 3)) for i in range(12)]  # 1-3 rows each
    try:
        first, results = behind_a_busy_thread(batcher, model, gate, np.full((1, 2), 100.0), arrays)
        assert first["y"].tolist() == [[200.0, 200.0]]
    finally:
        batcher.close()
    for x, result in zip(arrays, results):
        np.testing.assert_array_equal(result["y"], 2 * x)  # exactly what an unbatched call returns
        np.testing.assert_array_equal(result["total"], x.sum(axis=1))
    assert model.batches[0] == 1 and all(size <= 8 for size in model.batches)
    assert sum(model.batches[1:]) == sum(len(x) for x in arrays) and len(model.batches) - 1 < len(arrays)
    assert (batcher.batches, batcher.tasks) == (len(model.batches), 13)


def test_one_bad_request_fails_only_itself():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(BatchingParameters(max_batch_size=16, num_batch_threads=1), model)
    arrays = [np.array([[float(i), 1.0]]) for i in range(6)]
    arrays[3] = np.array([[-1.0, 1.0]])
    try:
        _, results = behind_a_busy_thread(batcher, model, gate, np.zeros((1, 2)), arrays)
    finally:
        batcher.close()
    assert model.batches[:2] == [1, 6]  # the six were run together first, then one by one
    assert isinstance(results[3], types.ServingError) and results[3].message == "malformed input"
    for i in (0, 1, 2, 4, 5):
        np.testing.assert_array_equal(results[i]["y"], 2 * arrays[i])


def test_timeout_gathers_a_batch_and_allowed_sizes_pad_it():
    model = Model()
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=2_000_000, allowed_batch_sizes=(4, 8))
    batcher = Batcher(params, model)
    try:
        arrays = [np.array([[float(i), 0.0]]) for i in range(3)]
        results = submit_all(batcher, arrays)
    finally:
        batcher.close()
    assert model.batches == [4]  # three requests within the timeout, padded to the allowed size 4
    for x, result in zip(arrays, results):
        np.testing.assert_array_equal(result["y"], 2 * x)


def test_variable_length_inputs_are_padded_with_the_first_value():
    model = Model()
    params = BatchingParameters(max_batch_size=4, batch_timeout_micros=2_000_000, pad_variable_length_inputs=True)
    batcher = Batcher(params, model)
    try:
        a, b = np.array([[5.0, 6.0]]), np.array([[1.0, 2.0, 3.0]])
        results = submit_all(batcher, [a, b])
    finally:
        batcher.close()
    assert model.batches == [2]
    np.testing.assert_array_equal(results[0]["y"], [[10.0, 12.0, 10.0]])  # padded with 5, TF Serving's PadTensor
    np.testing.assert_array_equal(results[1]["y"], [[2.0, 4.0, 6.0]])


def test_full_queue_and_oversized_requests_get_tf_serving_errors():
    gate = threading.Event()
    model = Model(gate)
    params = BatchingParameters(max_batch_size=2, num_batch_threads=1, max_enqueued_batches=1)
    batcher = Batcher(params, model)
    try:
        running = batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))})
        wait_until(lambda: model.batches, "the running request to start")
        pending = [batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))}) for _ in range(2)]
        with pytest.raises(types.ServingError) as full:
            batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))})
        assert (full.value.code, full.value.http_status) == ("UNAVAILABLE", 503)
        assert full.value.message == "The batch scheduling queue to which this task was submitted is full"
        with pytest.raises(types.ServingError, match="Task size 3 is larger than maximum input batch size 2"):
            batcher.submit("servable", "serving_default", {"x": np.zeros((3, 1))})
        gate.set()
        assert all(f.result(30)["y"].shape == (1, 1) for f in [running, *pending])
    finally:
        gate.set()
        batcher.close()
    # TF Serving's defaults (its batch scheduler's QueueOptions): requests of up to 1000 examples, split or not
    for params in (BatchingParameters(), BatchingParameters(enable_large_batch_splitting=True)):
        default = Batcher(params, Model())
        try:
            assert default.submit("servable", "serving_default", {"x": np.ones((1000, 1))}).result(30)["y"].shape == (
                1000, 1)
            with pytest.raises(types.ServingError, match="Task size 1001 is larger than maximum input batch size 1000"):
                default.submit("servable", "serving_default", {"x": np.ones((1001, 1))})
        finally:
            default.close()


def test_large_batch_splitting_fills_the_batch_being_filled_then_runs_pieces_of_the_execution_size():
    gate = threading.Event()
    model = Model(gate)
    params = BatchingParameters(max_batch_size=8, num_batch_threads=1, enable_large_batch_splitting=True,
                                max_execution_batch_size=3)
    batcher = Batcher(params, model)
    small, large = np.array([[7.0, 7.5]]), np.arange(10.0).reshape(5, 2)
    try:
        _, results = behind_a_busy_thread(batcher, model, gate, np.zeros((1, 2)), [small, large], entries=3)
    finally:
        batcher.close()
    # whichever came first, the five rows were split to fill a batch of three: two batches of three
    assert model.batches[0] == 1 and sorted(model.batches[1:]) == [3, 3]
    np.testing.assert_array_equal(results[0]["y"], 2 * small)
    np.testing.assert_array_equal(results[1]["y"], 2 * large)  # the pieces' answers joined in order
    np.testing.assert_array_equal(results[1]["total"], large.sum(axis=1))


def test_a_split_request_fails_whole_when_one_piece_fails_and_alone_when_outputs_have_no_batch_dimension():
    params = BatchingParameters(max_batch_size=8, num_batch_threads=1, enable_large_batch_splitting=True,
                                max_execution_batch_size=2)
    bad = np.array([[1.0], [2.0], [3.0], [-1.0], [5.0]])  # the second piece of three holds the malformed row
    batcher = Batcher(params, model := Model())
    try:
        with pytest.raises(types.ServingError, match="malformed input"):
            batcher.submit("servable", "serving_default", {"x": bad}).result(30)
        assert model.batches == [2, 2, 2, 1]  # each piece ran; the failed one again on its own
    finally:
        batcher.close()
    batcher = Batcher(params, lambda servable, signature, inputs: {"y": np.float32(inputs["x"].sum())})
    try:
        with pytest.raises(types.ServingError) as err:
            batcher.submit("servable", "serving_default", {"x": np.ones((3, 1))}).result(30)
        # TF Serving's error for an output it cannot split or join (batching_session.cc)
        assert (err.value.code, err.value.message) == ("FAILED_PRECONDITION", "Batched output tensor has 0 dimensions")
    finally:
        batcher.close()


def test_serve_refuses_a_bad_parameter_file_before_starting(tmp_path, capsys):
    import hvdk8s.cli

    (bad := tmp_path / "batching.txt").write_text("max_batch_size { value: 8 }\nbogus: 1\n")
    assert hvdk8s.cli.main(["serve", str(tmp_path), "--batching_parameters_file", str(bad)]) == 2
    assert f'{bad}: 2:1 : Message type "tensorflow.serving.BatchingParameters" has no field named "bogus".' in (
        capsys.readouterr().err)
    assert hvdk8s.cli.main(["serve", str(tmp_path), "--enable_batching=false", "--batching_parameters_file",
                            str(bad)]) == 2
    assert "--batching_parameters_file needs --enable_batching=true" in capsys.readouterr().err


def test_requests_from_one_pass_of_an_event_loop_form_one_batch_and_answer_on_the_loop():
    model = Model()
    batcher = Batcher(BatchingParameters(max_batch_size=8, num_batch_threads=1), model)
    arrays = [np.full((1, 2), float(i)) for i in range(6)] + [np.array([[-1.0, 0.0]])]

    async def main():
        futures = [batcher.submit_async("servable", "serving_default", {"x": x}) for x in arrays]
        assert not model.batches  # queued only when this pass of the loop ends
        return await asyncio.gather(*futures, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        batcher.close()
    assert model.batches[0] == 7  # all together, then each again alone since the malformed one failed the batch
    assert sorted(model.batches[1:]) == [1] * 7
    for x, result in zip(arrays[:-1], results):
        np.testing.assert_array_equal(result["y"], 2 * x)
    assert isinstance(results[-1], types.ServingError) and results[-1].message == "malformed input"


def test_event_loop_requests_refused_by_a_full_queue_get_the_error_as_their_answer():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(BatchingParameters(max_batch_size=2, num_batch_threads=1, max_enqueued_batches=1), model)

    async def main():
        running = batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))})
        await asyncio.to_thread(wait_until, lambda: model.batches, "the running request to start")
        futures = [batcher.submit_async("servable", "serving_default", {"x": np.ones((1, 1))}) for _ in range(3)]
        await asyncio.sleep(0)  # the pass ends: two fit the queue, the third does not
        refused = await asyncio.gather(futures[2], return_exceptions=True)
        gate.set()
        return running.result(30), await asyncio.gather(*futures[:2]), refused[0]

    try:
        first, queued_ok, refused = asyncio.run(main())
    finally:
        gate.set()
        batcher.close()
    assert first["y"].shape == (1, 1) and [r["y"].tolist() for r in queued_ok] == [[[2.0]], [[2.0]]]
    assert (refused.code, refused.http_status) == ("UNAVAILABLE", 503)
    assert refused.message == "The batch scheduling queue to which this task was submitted is full"


def test_one_pass_of_the_loop_wakes_a_batch_thread_for_each_batch_it_fills():
    """Requests of two shapes in one pass make two batches: both threads must wake, or the first waits alone."""
    barrier = threading.Barrier(2, timeout=10)

    def both_at_once(servable, signature, inputs):
        barrier.wait()  # raises BrokenBarrierError unless the other batch runs at the same time
        return {"y": 2 * inputs["x"]}

    batcher = Batcher(BatchingParameters(max_batch_size=8, num_batch_threads=2), both_at_once)

    async def main():
        futures = [batcher.submit_async("servable", "serving_default", {"x": np.ones((1, width))}) for width in (2, 3)]
        return await asyncio.gather(*futures)

    try:
        first, second = asyncio.run(main())
    finally:
        batcher.close()
    assert first["y"].shape == (1, 2) and second["y"].shape == (1, 3)


def test_a_request_cancelled_before_its_pass_ends_neither_runs_nor_stalls_the_others():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(BatchingParameters(max_batch_size=1, num_batch_threads=1, max_enqueued_batches=1), model)

    def later(width: int) -> asyncio.Future:
        return batcher.submit_async("servable", "serving_default", {"x": np.ones((1, width))})

    async def main():
        running = batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))})
        await asyncio.to_thread(wait_until, lambda: model.batches, "the running request to start")
        queued = later(1)
        await asyncio.sleep(0)  # its pass ends: the queue for (1, 1) inputs is full
        cancelled, other = later(1), later(2)  # the first would be refused, the second has a queue of its own
        cancelled.cancel()
        await asyncio.sleep(0)
        gate.set()
        return running.result(30), await asyncio.wait_for(asyncio.gather(queued, other), 10)

    try:
        first, (queued, other) = asyncio.run(main())
    finally:
        gate.set()
        batcher.close()
    assert queued["y"].tolist() == [[2.0]] and other["y"].tolist() == [[2.0, 2.0]]
    assert model.batches == [1, 1, 1]  # the cancelled request never ran


def test_an_outcome_a_future_refuses_becomes_an_error_instead_of_a_request_that_never_returns():
    def stops(servable, signature, inputs):
        raise StopIteration  # a model's bug; an asyncio future refuses it as an exception

    batcher = Batcher(BatchingParameters(max_batch_size=4, num_batch_threads=1), stops)

    async def main():
        futures = [batcher.submit_async("servable", "serving_default", {"x": np.ones((1, 1))}) for _ in range(2)]
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)

    try:
        results = asyncio.run(main())
    finally:
        batcher.close()
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert "StopIteration" in str(results[0]) and "could not be handed back" in str(results[0])


def test_a_request_cancelled_while_queued_is_not_run():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(BatchingParameters(max_batch_size=8, num_batch_threads=1), model)
    try:
        running = batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))})
        wait_until(lambda: model.batches, "the running request to start")
        given_up = batcher.submit("servable", "serving_default", {"x": np.ones((2, 1))})
        kept = batcher.submit("servable", "serving_default", {"x": np.ones((3, 1))})
        assert given_up.cancel()  # what a gRPC handler does when its client's deadline passes
        gate.set()
        assert kept.result(30)["y"].shape == (3, 1) and running.result(30)["y"].shape == (1, 1)
    finally:
        gate.set()
        batcher.close()
    assert model.batches == [1, 3]


SPLIT_IN_FOUR = BatchingParameters(max_batch_size=8, num_batch_threads=4, enable_large_batch_splitting=True,
                                   max_execution_batch_size=2)  # a request of 8 rows: 4 pieces of 2


def test_a_split_requests_pieces_run_side_by_side_on_the_batch_threads():
    """submit wakes a batch thread per piece; it woke one, which ran the pieces one after another."""
    barrier = threading.Barrier(4, timeout=10)

    def all_at_once(servable, signature, inputs):
        barrier.wait()  # raises BrokenBarrierError unless the four pieces run at the same time
        return {"y": 2 * inputs["x"]}

    batcher = Batcher(SPLIT_IN_FOUR, all_at_once)
    x = np.arange(8.0).reshape(8, 1)
    try:
        np.testing.assert_array_equal(batcher.submit("servable", "serving_default", {"x": x}).result(30)["y"], 2 * x)
    finally:
        batcher.close()


def test_the_pieces_of_a_request_cancelled_while_queued_are_not_run():
    """What a gRPC handler does when its client's deadline passes: none of the request's pieces runs."""
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(SPLIT_IN_FOUR, model)
    try:
        running = []
        for i in range(4):  # one at a time, so each occupies a batch thread of its own
            running.append(batcher.submit("servable", "serving_default", {"x": np.zeros((1, 1))}))
            wait_until(lambda: len(model.batches) == i + 1, f"request {i} to start")
        given_up = batcher.submit("servable", "serving_default", {"x": np.ones((8, 1))})
        assert queued(batcher) == 4 and given_up.cancel()
        gate.set()
        assert batcher.submit("servable", "serving_default", {"x": np.ones((1, 1))}).result(30)["y"].shape == (1, 1)
        assert all(r.result(30)["y"].shape == (1, 1) for r in running)
    finally:
        gate.set()
        batcher.close()
    assert model.batches == [1, 1, 1, 1, 1]
