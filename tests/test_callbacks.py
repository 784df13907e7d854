"""hvdk8s's Horovod callbacks in one in-process rank: BestModelCheckpoint's paths, the broadcast's warning."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

# In the test process TensorFlow may already run (earlier in-process tests), so init cannot pin threads.
pytestmark = pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")

DATA = (np.ones((8, 3), np.float32), np.ones((8, 1), np.float32))


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


def model(hvd, optimizer=None, cls=None):
    import keras

    cls = cls or keras.Sequential
    m = cls([keras.Input((3,)), keras.layers.Dense(1)])
    m.compile(optimizer or hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    return m


def fit_best(hvd, checkpoint) -> None:
    model(hvd).fit(*DATA, validation_data=DATA, epochs=2, verbose=0, callbacks=[checkpoint])


LEGACY = (" (Keras would write a legacy HDF5 model there, which hvdk8s.load_model refuses: Keras 3 cannot resume "
          "training from it; `hvdk8s migrate` rewrites .h5 checkpoint paths)")


H5_MODEL = f"filepath='{{path}}' must end in .keras{LEGACY}"
PATHS = [  # (name, save_weights_only, the refusal)
    ("best.keras", False, None), ("best.weights.h5", True, None), ("best.h5", False, H5_MODEL),
]
LATER_ONLY = [  # Keras's constructor refuses these already
    ("best.hdf5", False, H5_MODEL), ("best.h5", True, "filepath='{path}' must end in .weights.h5"),
]


CASES = [(True, *case) for case in PATHS] + [(False, *case) for case in PATHS + LATER_ONLY]


@pytest.mark.parametrize("passed, name, weights_only, problem", CASES,
                         ids=[f"{'filepath=' if c[0] else 'set later'}-{c[1]}{'-weights_only' if c[2] else ''}" for c in CASES])
def test_best_model_checkpoint_refuses_paths_hvdk8s_cannot_resume_from(
    hvd, tmp_path: Path, passed: bool, name: str, weights_only: bool, problem: str | None
) -> None:
    path = str(tmp_path / name)
    if passed:
        checkpoint = hvd.callbacks.BestModelCheckpoint(save_weights_only=weights_only, filepath=path)
    else:  # Horovod's Spark estimator's way
        checkpoint = hvd.callbacks.BestModelCheckpoint(save_weights_only=weights_only)
        checkpoint.filepath = path
    if problem is None:
        fit_best(hvd, checkpoint)
        assert Path(path).is_file()
        if not weights_only:
            hvd.load_model(path)
    else:
        with pytest.raises(ValueError) as err:
            fit_best(hvd, checkpoint)
        assert str(err.value) == "BestModelCheckpoint: " + problem.format(path=path)
        assert not Path(path).exists()


def test_best_model_checkpoint_without_a_path_raises_at_train_begin(hvd) -> None:
    with pytest.raises(ValueError, match=r"^BestModelCheckpoint: set \.filepath \(or pass filepath=\) before training$"):
        fit_best(hvd, hvd.callbacks.BestModelCheckpoint())


def broadcast_warnings(hvd, m) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.fit(*DATA, batch_size=4, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [str(w.message) for w in caught if "not a DistributedOptimizer" in str(w.message)]


def test_broadcast_warns_of_diverging_ranks_only_where_keras_applies_unreduced_gradients(
    hvd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose own train_step reduces with DistributedGradientTape and applies with a plain optimizer
    (the tape's usage) does not diverge; Keras's train_step with that optimizer does."""
    import keras
    import tensorflow as tf

    class TapeModel(keras.Sequential):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            grads = hvd.DistributedGradientTape(tape).gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return {"loss": loss}

    monkeypatch.setattr(hvd.runtime, "size", lambda: 2)  # the warning's condition; the job itself has one rank
    assert len(broadcast_warnings(hvd, model(hvd, keras.optimizers.SGD(0.1)))) == 1
    assert broadcast_warnings(hvd, model(hvd, keras.optimizers.SGD(0.1), cls=TapeModel)) == []
    assert broadcast_warnings(hvd, model(hvd)) == []


def test_broadcast_runs_once_per_callback_and_model_as_in_horovod(hvd, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that calls ``fit`` once per epoch with the same callback broadcasts before its first step only
    (Horovod's ``broadcast_done``); the same callback given another model broadcasts that one."""
    from hvdk8s import collectives

    calls: list[int] = []
    real = collectives.broadcast_variables
    monkeypatch.setattr(collectives, "broadcast_variables", lambda v, root: calls.append(len(v)) or real(v, root))
    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    first, second = model(hvd), model(hvd)
    for m in (first, first, first, second, second):
        m.fit(*DATA, batch_size=4, verbose=0, callbacks=[broadcast])
    assert len(calls) == 2 and broadcast.broadcast_done
    assert calls[0] == len(first.variables) + len(first.optimizer.variables)


def test_broadcast_callback_refuses_a_root_rank_that_is_no_rank(hvd) -> None:
    """The type when it is made; the range (the job's size is known only after init) when it broadcasts, in fit."""
    with pytest.raises(TypeError) as refused:
        hvd.callbacks.BroadcastGlobalVariablesCallback("0")
    assert str(refused.value) == "root_rank: expected a whole number, got str '0'"
    with pytest.raises(ValueError) as refused:
        hvd.callbacks.BroadcastGlobalVariablesCallback(-1)
    assert str(refused.value) == "root_rank=-1: must be >= 0"
    with pytest.raises(ValueError) as refused:
        model(hvd).fit(*DATA, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(5)])
    assert str(refused.value) == "root_rank=5: not a rank of the process set (size 1: ranks 0 to 0)"


@pytest.mark.parametrize("make, error, message", [
    (lambda cb: cb.LearningRateWarmupCallback("0.1"), TypeError, "initial_lr: expected a number, got str '0.1'"),
    (lambda cb: cb.LearningRateWarmupCallback(-0.1), ValueError, "initial_lr=-0.1: must be >= 0"),
    (lambda cb: cb.LearningRateWarmupCallback(0.1, warmup_epochs=-1), ValueError, "warmup_epochs=-1: must be >= 0"),
    (lambda cb: cb.LearningRateWarmupCallback(0.1, warmup_epochs="5"), TypeError,
     "warmup_epochs: expected a number, got str '5'"),
    (lambda cb: cb.LearningRateWarmupCallback(0.1, steps_per_epoch=-2), ValueError, "steps_per_epoch=-2: must be > 0"),
    (lambda cb: cb.LearningRateWarmupCallback(0.1, steps_per_epoch="10"), TypeError,
     "steps_per_epoch: expected a number, got str '10'"),
    (lambda cb: cb.LearningRateScheduleCallback(0.1, multiplier="x"), TypeError,
     "multiplier: expected a number, got str 'x'"),
    (lambda cb: cb.LearningRateScheduleCallback(0.1, multiplier=-0.5), ValueError, "multiplier=-0.5: must be >= 0"),
    (lambda cb: cb.LearningRateScheduleCallback(0.1, 0.5, start_epoch="1"), TypeError,
     "start_epoch: expected a number, got str '1'"),
    (lambda cb: cb.LearningRateScheduleCallback(0.1, 0.5, end_epoch="3"), TypeError,
     "end_epoch: expected a number, got str '3'"),
    (lambda cb: cb.LearningRateScheduleCallback(None, 0.5), ValueError, "Parameter `initial_lr` is required"),
])
def test_rate_callbacks_refuse_non_numbers_when_made_not_at_fit(hvd, make, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as refused:
        make(hvd.callbacks)
    assert str(refused.value) == message


def test_rate_callbacks_keep_what_horovod_takes(hvd) -> None:
    """A callable multiplier, no warm-up (0 epochs), a float warm-up (Horovod's ImageNet example's --warmup-epochs
    is a float), steps per epoch as a float or 0 (Horovod divides by it as a float; 0 takes fit's) and numpy
    numbers still train, through default_callbacks too."""
    callbacks = [hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda epoch: 0.5, start_epoch=1.0,
                                                            steps_per_epoch=np.float64(2.0)),
                 hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=0, steps_per_epoch=0),
                 hvd.callbacks.LearningRateWarmupCallback(np.float32(0.1), warmup_epochs=1.0, steps_per_epoch=2.0)]
    history = model(hvd).fit(*DATA, epochs=2, batch_size=4, verbose=0, callbacks=callbacks).history
    assert history["lr"] == pytest.approx([0.1, 0.05])
    made = hvd.default_callbacks(initial_lr=0.1, warmup_epochs=1.5, checkpoint_every=np.int64(1))
    assert [c.warmup_epochs for c in made if isinstance(c, hvd.callbacks.LearningRateWarmupCallback)] == [1.5]


@pytest.mark.parametrize("arguments, error, message", [
    ({"checkpoint_every": "2", "checkpoint_dir": "ckpt"}, TypeError,
     "checkpoint_every: expected a whole number, got str '2'"),
    ({"checkpoint_every": 0}, ValueError, "checkpoint_every=0: must be >= 1"),
    ({"keep_checkpoints": 1.5}, TypeError, "keep_checkpoints: expected a whole number, got float 1.5"),
    ({"metrics_port": "abc"}, TypeError, "metrics_port: expected a whole number, got str 'abc'"),
    ({"metrics_port": -1}, ValueError, "metrics_port=-1: must be >= 0"),
    ({"warmup_epochs": -1, "initial_lr": 0.1}, ValueError, "warmup_epochs=-1: must be >= 0"),
    ({"warmup_epochs": -1}, ValueError, "warmup_epochs=-1: must be >= 0"),
    ({"warmup_epochs": 2, "initial_lr": "0.1"}, TypeError, "initial_lr: expected a number, got str '0.1'"),
    ({"batch_size": "32"}, TypeError, "batch_size: expected a whole number, got str '32'"),
])
def test_default_callbacks_refuse_bad_numbers_naming_them(
    hvd, tmp_path: Path, arguments: dict, error: type[Exception], message: str
) -> None:
    if "checkpoint_dir" in arguments:
        arguments["checkpoint_dir"] = tmp_path / arguments["checkpoint_dir"]
    with pytest.raises(error) as refused:
        hvd.default_callbacks(**arguments)
    assert str(refused.value) == message
