"""Data-parallel training on real MPI processes: numbers, not smoke."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_ranks


def load(out: Path, rank: int) -> tuple[int, list[np.ndarray]]:
    with np.load(out / f"rank{rank}.npz") as npz:
        weights = [npz[f"arr_{i}"] for i in range(len(npz.files) - 1)]
        return int(npz["iterations"]), weights


def load_initial(out: Path, rank: int) -> list[np.ndarray]:
    """The weights a rank's model started from, as its seed made them (before any broadcast or training)."""
    with np.load(out / f"rank{rank}.initial.npz") as npz:
        return [npz[f"arr_{i}"] for i in range(len(npz.files))]


def assert_same_weights(a: list[np.ndarray], b: list[np.ndarray], **tol) -> None:
    assert len(a) == len(b)
    for wa, wb in zip(a, b):
        np.testing.assert_allclose(wa, wb, **tol)


# Every case of tests/mpi_scripts/train_equivalence.py, by rank count: one launch each (TensorFlow's and
# Horovod's start-up once per rank, not once per case).
TWO_RANKS = {
    "fit": "--batch 8 --steps 6 --mode fit",
    "tape": "--batch 8 --steps 6 --mode tape",
    "fit_spe4": "--batch 8 --steps 6 --mode fit --steps-per-execution 4",
    "passes2": "--batch 8 --steps 12 --passes 2",  # 2 ranks × batch 8 × 2 passes (averaged): updates of 32 examples
    "seed_per_rank": "--batch 8 --seed-per-rank",
}
ONE_RANK = {"batch16": "--batch 16 --steps 6", "batch32": "--batch 32 --steps 6"}


def launch(tmp_path_factory: pytest.TempPathFactory, ranks: int, cases: dict[str, str]) -> Path:
    out = tmp_path_factory.mktemp(f"equivalence{ranks}")
    run_ranks(ranks, "train_equivalence.py", str(out), *(f"{name} {flags}" for name, flags in cases.items()))
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launch(tmp_path_factory, 2, TWO_RANKS)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launch(tmp_path_factory, 1, ONE_RANK)


@pytest.mark.parametrize("case", ["fit", "tape", "fit_spe4"])
def test_two_ranks_batch_b_equal_one_process_batch_2b(case: str, two_ranks: Path, one_rank: Path) -> None:
    """Also with Keras running 4 steps per compiled call (6 steps: one call of 4, one of the last 2)."""
    ref_iterations, ref_weights = load(one_rank / "batch16", 0)
    initial = load_initial_weights()
    assert len(ref_weights) == len(initial) == 4  # conv kernel and bias, dense kernel and bias
    for rank in (0, 1):
        iterations, weights = load(two_ranks / case, rank)
        assert iterations == ref_iterations == 6
        assert_same_weights(weights, ref_weights, rtol=1e-5, atol=1e-5)
        # and the result is not the trivial one: training moved the weights
        assert max(np.abs(w - w0).max() for w, w0 in zip(weights, initial)) > 1e-2


def load_initial_weights() -> list[np.ndarray]:
    import keras

    seed = 7
    model = keras.Sequential([
        keras.Input((12, 12, 1)),
        keras.layers.Conv2D(4, 3, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed)),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
    ])
    return model.get_weights()


def test_backward_passes_per_step_equals_larger_batch(two_ranks: Path, one_rank: Path) -> None:
    # 12 batches of 2 ranks × 8, 2 passes each → 6 updates of 32 examples, as one process at batch 32
    ref_iterations, ref_weights = load(one_rank / "batch32", 0)
    assert len(ref_weights) == 4
    for rank in (0, 1):
        iterations, weights = load(two_ranks / "passes2", rank)
        assert (iterations, ref_iterations) == (12, 6)  # Horovod counts every backward pass in `iterations`
        assert_same_weights(weights, ref_weights, rtol=1e-5, atol=1e-5)


def test_ranks_hold_identical_weights_after_fit_from_different_seeds(two_ranks: Path) -> None:
    _, w0 = load(two_ranks / "seed_per_rank", 0)
    _, w1 = load(two_ranks / "seed_per_rank", 1)
    start0, start1 = load_initial(two_ranks / "seed_per_rank", 0), load_initial(two_ranks / "seed_per_rank", 1)
    assert len(w0) == len(w1) == len(start0) == len(start1) == 4  # conv kernel and bias, dense kernel and bias
    # the seeds really differed: both kernels started apart (the biases start at zero on every rank)
    assert not np.array_equal(start0[0], start1[0]) and not np.array_equal(start0[2], start1[2])
    for a, b in zip(w0, w1, strict=True):
        assert np.array_equal(a, b), "ranks diverged"
    assert not np.array_equal(w1[0], start1[0])  # rank 1 left its own start (rank 0's broadcast, then training)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("collectives")
    run_ranks(2, "collectives_check.py", str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_metric_average_direct(collectives: list[dict]) -> None:
    for result in collectives:
        assert result["direct_average"] == {"loss": 0.5, "accuracy": 5.0, "note": "text stays"}


def test_metric_average_inside_fit_is_mean_of_rank_logs(collectives: list[dict]) -> None:
    r0, r1 = collectives
    assert r0["history"] == r1["history"]
    for epoch, averaged_loss in enumerate(r0["history"]["loss"]):
        raw = [r["raw_logs"][epoch] for r in collectives]
        assert raw[0]["loss"] != raw[1]["loss"]  # ranks saw different data
        assert averaged_loss == pytest.approx((raw[0]["loss"] + raw[1]["loss"]) / 2, rel=1e-9)
        assert r0["history"]["accuracy"][epoch] == pytest.approx((raw[0]["accuracy"] + raw[1]["accuracy"]) / 2)
    assert r0["weights"] == r1["weights"]


def test_fp16_compression_and_sum(collectives: list[dict]) -> None:
    exact = (1.0001 + 1.0002) / 2
    half = float((np.float16(1.0001) + np.float16(1.0002)) / 2)
    for result in collectives:
        np.testing.assert_allclose(result["update_none"], [exact] * 3, rtol=1e-6)
        np.testing.assert_allclose(result["update_fp16"], [half] * 3, rtol=1e-6)
        assert abs(half - exact) > 1e-5  # fp16 really changed the numbers
        assert result["update_sum"] == [2.0, 1.0]


@pytest.mark.unit
@pytest.mark.parametrize("arguments, error, message", [
    ({"input_shape": (28, 28)}, ValueError, "input_shape=(28, 28): expected (height, width, channels)"),
    ({"input_shape": (28, 28, 0)}, ValueError, "input_shape[2]=0: must be >= 1"),
    ({"input_shape": (3, 28, 1)}, ValueError, "input_shape[0]=3: must be >= 4"),  # two 2x2 poolings: 3 → 1 → 0
    ({"input_shape": (28, "28", 1)}, TypeError, "input_shape[1]: expected a whole number, got str '28'"),
    ({"num_classes": 0}, ValueError, "num_classes=0: must be >= 1"),
    ({"num_classes": 2.0}, TypeError, "num_classes: expected a whole number, got float 2.0"),
])
def test_cnn_refuses_shapes_and_class_counts_it_cannot_build(
    arguments: dict, error: type[Exception], message: str
) -> None:
    from hvdk8s import models

    for variant in models.VARIANTS:
        with pytest.raises(error) as refused:
            models.cnn(variant, **arguments)
        assert str(refused.value) == message
    assert models.cnn(input_shape=(4, 4, 1), num_classes=1).output_shape == (None, 1)


# Bad arguments to the collectives and the distributed optimizer, in-process at one rank: each is refused where it
# is passed, naming it, not by a TensorFlow or Horovod op error (or silently) later.


@pytest.fixture(scope="module")
def hvd_in_process():
    import warnings

    import hvdk8s

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TensorFlow may already run here: init then cannot pin threads
        hvdk8s.init(quiet=True)
    return hvdk8s


OUTSIDE = "root_rank={}: not a rank of the process set (size 1: ranks 0 to 0)"
ROOT_RANKS = [(-1, ValueError, "root_rank=-1: must be >= 0"), (1, ValueError, OUTSIDE.format(1)),
              (3, ValueError, OUTSIDE.format(3)), ("0", TypeError, "root_rank: expected a whole number, got str '0'"),
              (0.0, TypeError, "root_rank: expected a whole number, got float 0.0")]


@pytest.mark.unit
@pytest.mark.parametrize("call", ["broadcast", "broadcast_object", "broadcast_variables"])
@pytest.mark.parametrize("root_rank, error, message", ROOT_RANKS)
def test_broadcasts_refuse_a_root_rank_outside_the_process_set(
    hvd_in_process, call: str, root_rank: object, error: type[Exception], message: str
) -> None:
    import tensorflow as tf

    hvd = hvd_in_process
    variable = tf.Variable(1.0)
    calls = {"broadcast": lambda: hvd.broadcast(1.0, root_rank), "broadcast_object": lambda: hvd.broadcast_object(
        1, root_rank=root_rank), "broadcast_variables": lambda: hvd.broadcast_variables([variable], root_rank)}
    with pytest.raises(error) as refused:
        calls[call]()
    assert str(refused.value) == message
    hvd.broadcast_variables([variable], root_rank=0)  # and rank 0 still broadcasts
    assert float(hvd.broadcast(2.0, 0)) == 2.0 and hvd.broadcast_object("x", root_rank=0) == "x"


@pytest.mark.unit
def test_a_process_sets_root_rank_is_one_of_its_global_ranks(hvd_in_process) -> None:
    from types import SimpleNamespace

    from hvdk8s import collectives as hc

    odd = SimpleNamespace(ranks=[1, 3])  # a process set's ranks as Horovod holds them; broadcasts take global ranks
    assert hc._root_rank(3, odd) == 3
    with pytest.raises(ValueError) as refused:
        hc._root_rank(2, odd)
    assert str(refused.value) == "root_rank=2: not a rank of the process set (size 2: ranks [1, 3], global ranks as " \
                                 "in Horovod)"


OPS = ("hvdk8s.Average, hvdk8s.Sum, hvdk8s.Adasum, horovod.tensorflow.Min, horovod.tensorflow.Max, "
       "horovod.tensorflow.Product")


@pytest.mark.unit
@pytest.mark.parametrize("call, arguments, error, message", [
    ("allreduce", {"op": "sum"}, ValueError, f"op='sum': expected one of {OPS}"),
    ("allreduce", {"op": True}, ValueError, f"op=True: expected one of {OPS}"),  # True == Sum, but not an op
    ("reducescatter", {"op": "sum"}, ValueError, f"op='sum': expected one of {OPS}"),
    ("allreduce", {"compression": None}, TypeError, "compression: expected hvdk8s.Compression.none or "
     "hvdk8s.Compression.fp16 (or their names), got NoneType None"),
    ("allreduce", {"compression": True}, TypeError, "compression: expected hvdk8s.Compression.none or "
     "hvdk8s.Compression.fp16 (or their names), got bool True"),
    ("allreduce", {"compression": "gzip"}, ValueError, "compression='gzip': expected one of ['fp16', 'none']"),
])
def test_collectives_refuse_ops_and_compressions_horovod_has_not(
    hvd_in_process, call: str, arguments: dict, error: type[Exception], message: str
) -> None:
    hvd = hvd_in_process
    with pytest.raises(error) as refused:
        getattr(hvd, call)([1.0, 2.0], **arguments)
    assert str(refused.value) == message
    for compression in (hvd.Compression.none, hvd.Compression.fp16, "none", "fp16"):  # Horovod's, and their names
        assert hvd.allreduce([1.0, 2.0], op=hvd.Sum, compression=compression).numpy().tolist() == [1.0, 2.0]


@pytest.mark.unit
@pytest.mark.parametrize("arguments, error, message", [
    ({"backward_passes_per_step": "2"}, TypeError, "backward_passes_per_step: expected a whole number, got str '2'"),
    ({"backward_passes_per_step": None}, TypeError,
     "backward_passes_per_step: expected a whole number, got NoneType None"),
    ({"backward_passes_per_step": 1.5}, TypeError, "backward_passes_per_step: expected a whole number, got float 1.5"),
    ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step=0: must be >= 1"),
    ({"groups": 2.0}, ValueError, "groups: expected a positive integer or a list of lists of variables, got float"),
    ({"gradient_predivide_factor": 0}, ValueError, "gradient_predivide_factor=0: must be > 0"),
    ({"gradient_predivide_factor": "2"}, TypeError, "gradient_predivide_factor: expected a number, got str '2'"),
    ({"process_set": [0]}, TypeError, "process_set: expected a hvdk8s.ProcessSet (hvdk8s.global_process_set, or one "
     "from hvdk8s.add_process_set), got list [0]"),
    ({"sparse_as_dense": "no"}, TypeError, "sparse_as_dense: expected True or False, got str 'no'"),
    ({"compression": None}, TypeError, "compression: expected hvdk8s.Compression.none or hvdk8s.Compression.fp16 (or "
     "their names), got NoneType None"),
])
def test_distributed_optimizer_refuses_bad_arguments_when_made(
    hvd_in_process, arguments: dict, error: type[Exception], message: str
) -> None:
    """Before: a '<' TypeError, a float silently truncated, a ZeroDivisionError or AttributeError at the first step."""
    import keras

    hvd = hvd_in_process
    with pytest.raises(error) as refused:
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **arguments)
    assert str(refused.value) == message
    if "backward_passes_per_step" not in arguments:  # the tape takes the same arguments, with the same checks
        with pytest.raises(error) as refused:
            hvd.DistributedGradientTape(**arguments)
        assert str(refused.value) == message


@pytest.mark.unit
def test_distributed_optimizer_takes_the_values_horovod_scripts_pass(hvd_in_process) -> None:
    """numpy integers (a count read from an array), 0 and 1 and numpy bools for a flag (argparse type=int, a config
    file), Horovod's compressor objects."""
    import keras

    hvd = hvd_in_process
    for arguments in ({"backward_passes_per_step": np.int64(2), "groups": np.int32(2)}, {"sparse_as_dense": 1},
                      {"sparse_as_dense": np.bool_(False)}, {"compression": hvd.Compression.fp16}):
        reduction = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **arguments).aggregation.reduction
        if "sparse_as_dense" in arguments:
            assert reduction.sparse_as_dense is bool(arguments["sparse_as_dense"])
    assert hvd.broadcast(np.float32(3.0), root_rank=np.int64(0)).numpy() == 3.0


@pytest.mark.unit
@pytest.mark.parametrize("local_layers, got", [("dense", "str"), ("kernel", "Variable"), (["kernel"], "Variable")])
def test_partial_distributed_optimizer_takes_layers_only_as_horovod_does(
    hvd_in_process, local_layers: object, got: str
) -> None:
    import keras

    hvd = hvd_in_process
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    kernel = model.layers[0].kernel
    given = kernel if local_layers == "kernel" else [kernel] if local_layers == ["kernel"] else local_layers
    with pytest.raises(ValueError) as refused:  # Horovod's type for this case
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=given)
    assert str(refused.value) == (f"local_layers: expected a Keras layer or several (their trainable weights stay "
                                  f"local), got {got}; register a variable with the optimizer's register_local_var")
    for layers in (model.layers[0], model.layers[:1], (layer for layer in model.layers[:1])):
        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=layers)
        assert len(opt.distributed_state.local_keys) == 2  # the first layer's kernel and bias
