"""The Keras-fit trainer's window clock, in process: windows start and end on the steps they claim,
with one step per compiled call and with several (``steps_per_execution``)."""
from __future__ import annotations

import pytest

from hvdk8s.benchmarks.config.settings import Workload
from hvdk8s.benchmarks.workers import trainers, workloads

pytestmark = pytest.mark.unit

WL = Workload("mlp", 4, 8)


def _trainer(k: int) -> trainers.KerasFitTrainer:
    return trainers.KerasFitTrainer(
        lambda: workloads.build_model(WL, 0),
        lambda rank, size, seed: workloads.synthetic_dataset(WL, WL.batch_per_rank),
        0.01,
        use_hvdk8s=False,
        steps_per_execution=k,
    )


class _StepLog:
    """``between``: records how many optimizer steps had run each time it was called."""

    def __init__(self, trainer: trainers.KerasFitTrainer) -> None:
        self.trainer, self.at = trainer, []

    def __call__(self) -> None:
        self.at.append(int(self.trainer.model.optimizer.iterations.numpy()))


@pytest.mark.parametrize("k", [1, 5])
def test_windows_start_and_end_on_their_steps(k: int) -> None:
    trainer = _trainer(k)
    log = _StepLog(trainer)
    windows = trainer.timed(warmup=5, steps=10, windows=2, between=log)
    assert len(windows) == 2 and min(windows) > 0
    # after the warm-up, then after each window: the clock saw exactly those step counts
    assert log.at == [5, 15, 25]
    assert int(trainer.model.optimizer.iterations.numpy()) == 25


def test_window_lengths_must_be_whole_compiled_calls() -> None:
    with pytest.raises(ValueError, match="multiples of steps_per_execution=5"):
        _trainer(5).timed(warmup=5, steps=12, windows=1)
