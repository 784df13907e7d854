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
