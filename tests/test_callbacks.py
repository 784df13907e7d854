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
