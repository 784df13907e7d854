"""Mixed precision (issue #31): every rank takes the same loss-scale decision, and none waits forever.

Keras 3's ``LossScaleOptimizer`` skips a step when the gradients hold inf/NaN.
Deciding on each rank's own gradients, a rank whose float16 gradients overflow
would skip the reduction that the others wait in. The 2-rank job
(``mpi_scripts/mixed_precision.py``) overflows only rank 0's first batch and
checks, per training path, that both ranks skipped the same steps, hold the
same loss scale and the same weights. The in-process tests (one rank) check
the wrapping: which optimizer ``DistributedOptimizer`` and ``compile`` give,
with Keras's own scale settings, saving and loading, and the refusal of the one
arrangement hvdk8s cannot fix.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import SCRIPTS, hvdk8s_cli

pytestmark = pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")

STEPS = 4  # mixed_precision.py's batches per case

# case: (iterations, loss scale, growth counter) both ranks must end with. The first step is skipped (the
# scale halves from 2**15); with backward_passes_per_step=2 the skipped step is the first update, and
# iterations counts the pass before it; with dynamic_growth_steps=2 the scale grows back after two good steps.
FLOAT16 = {
    "fit-fp16": (3, 16384.0, 3),
    "fit-fp16-user-lso": (3, 32768.0, 1),
    "fit-fp16-no-callbacks": (3, 16384.0, 3),
    "fit-fp16-passes2": (3, 16384.0, 1),
    "fit-fp16-compression": (3, 16384.0, 3),
    "loop-fp16": (3, 16384.0, 3),
    "loop-fp16-passes2": (3, 16384.0, 1),
    "loop-fp16-compression": (3, 16384.0, 3),
    "loop-fp16-tape": (3, 16384.0, 3),
    "loop-fp16-lso-of-distributed": (3, 16384.0, 3),
}
BFLOAT16 = ["fit-bf16", "loop-bf16"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both ranks' results of every case, from one 2-rank job.

    Horovod shuts a stalled job down after 30 s, and the subprocess has a
    timeout, so a rank stuck in a collective fails the test instead of hanging it.
    """
    import json

    out = tmp_path_factory.mktemp("mixed_precision")
    hvdk8s_cli(
        "run", "-np", "2", "--env", "HOROVOD_STALL_CHECK_TIME_SECONDS=5",
        "--env", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=30",
        str(SCRIPTS / "mixed_precision.py"), str(out), *FLOAT16, *BFLOAT16,
        timeout=400,
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def assert_same_on_both(r0: dict, r1: dict) -> None:
    for key in ("iterations", "scale", "step_counter"):
        assert r0.get(key) == r1.get(key), key
    assert len(r0["weights"]) == len(r1["weights"])
    for w0, w1 in zip(r0["weights"], r1["weights"]):
        assert np.isfinite(w0).all()
        np.testing.assert_array_equal(w0, w1)  # different data per rank: equal only if the gradients were reduced


@pytest.mark.parametrize("case", list(FLOAT16))
def test_float16_ranks_skip_the_same_steps(ranks: list[dict], case: str) -> None:
    r0, r1 = ranks[0][case], ranks[1][case]
    assert "error" not in r0 and "error" not in r1, (r0.get("error"), r1.get("error"))
    # the scenario: at the initial scale only rank 0's own gradients overflow
    assert (r0["local_finite"], r1["local_finite"]) == (False, True)
    assert_same_on_both(r0, r1)
    assert (r0["iterations"], r0["scale"], r0["step_counter"]) == FLOAT16[case]
    assert r0["class"] == "LossScaleOptimizer"
    if case.startswith("fit"):
        assert r0["warnings"] == [] and r1["warnings"] == []  # no "not a DistributedOptimizer" warning
        assert r0["same_optimizer_object"]  # compile's (or the user's) wrapper is the one that trained
    if case == "fit-fp16":  # what compile made: Keras's own settings
        assert (r0["initial_scale"], r0["dynamic_growth_steps"]) == (2.0**15, 2000)


@pytest.mark.parametrize("case", BFLOAT16)
def test_bfloat16_ranks_train_identically(ranks: list[dict], case: str) -> None:
    r0, r1 = ranks[0][case], ranks[1][case]
    assert "error" not in r0 and "error" not in r1
    assert r0["class"] == "SGD"  # no loss scaling under mixed_bfloat16
    assert_same_on_both(r0, r1)
    assert r0["iterations"] == STEPS


# --- one rank, in-process: how the optimizers are wrapped ---------------------------------------------------


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


@pytest.fixture
def float16_policy():
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def small_model():
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                             keras.layers.Dense(1, dtype="float32")])


def fit(hvd, model, steps: int = 3) -> list[str]:
    """Train ``steps`` batches with hvdk8s's broadcast callback; the hvdk8s warnings it gave."""
    rng = np.random.default_rng(0)
    x, y = rng.random((8 * steps, 4), dtype=np.float32), rng.random((8 * steps, 1), dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [str(w.message) for w in caught if "hvdk8s" in str(w.message)]


def test_distributed_optimizer_of_loss_scale_optimizer(hvd) -> None:
    import keras

    from hvdk8s.train.optimizer import is_distributed, is_distributed_class, reduces_gradients

    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024.0,
                                              dynamic_growth_steps=7)
    opt = hvd.DistributedOptimizer(lso, compression=hvd.Compression.fp16, backward_passes_per_step=2)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert type(opt).__name__ == "LossScaleOptimizer" and is_distributed_class(type(opt))
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (1024.0, 7)
    config, keras_config = opt.get_config(), lso.get_config()  # saves as Keras's own wrapper
    assert config.pop("inner_optimizer")["config"] == keras_config.pop("inner_optimizer")["config"]
    assert config == keras_config
    inner = opt.inner_optimizer
    assert is_distributed(inner) and isinstance(inner, keras.optimizers.SGD)
    assert inner.aggregation.passes == 2 and inner.aggregation.reduction.compression is hvd.Compression.fp16
    assert reduces_gradients(opt)
    # the same for Keras's wrapper around a DistributedOptimizer, and an already distributed optimizer rewraps
    assert reduces_gradients(keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD())))
    again = hvd.DistributedOptimizer(inner, backward_passes_per_step=3)
    assert again.aggregation.base is keras.optimizers.SGD and again.aggregation.passes == 3


def test_partial_distributed_optimizer_of_loss_scale_optimizer(hvd) -> None:
    import keras

    from hvdk8s.collectives import variable_key

    model = small_model()
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                                          local_layers=model.layers[0])
    local = opt.inner_optimizer.distributed_state.local_keys
    assert local == {variable_key(v) for v in model.layers[0].trainable_weights}


def test_compile_wrapper_becomes_distributed_before_the_first_step(hvd, float16_policy) -> None:
    """DistributedOptimizer(opt) stays as it is; compile wraps it with Keras's settings; the callback fixes that."""
    import keras

    from hvdk8s.train.optimizer import is_distributed, is_distributed_class

    dist = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    assert is_distributed(dist)  # not wrapped here: custom loops and auto_scale_loss=False get no loss scaling
    model = small_model()
    model.compile(optimizer=dist, loss="mse")
    lso = model.optimizer
    assert type(lso) is keras.optimizers.LossScaleOptimizer and lso.inner_optimizer is dist
    assert (lso.initial_scale, lso.dynamic_growth_steps) == (2.0**15, 2000)
    assert fit(hvd, model) == []
    assert model.optimizer is lso and is_distributed_class(type(lso))  # the same object, now reducing first
    assert int(dist.iterations.numpy()) == 3

    model = small_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse", auto_scale_loss=False)
    assert is_distributed(model.optimizer)


def test_compile_wrapper_is_switched_over_without_hvdk8s_callbacks(hvd, float16_policy) -> None:
    """fit without BroadcastGlobalVariablesCallback (an elastic script's warm-up fit): fit builds the optimizer
    before tracing its step, and the wrapper is switched over then."""
    import keras

    from hvdk8s.train.optimizer import is_distributed_class

    model = small_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    lso = model.optimizer
    model.fit(np.ones((8, 4), np.float32), np.ones((8, 1), np.float32), verbose=0)
    assert model.optimizer is lso and is_distributed_class(type(lso))
    assert int(lso.inner_optimizer.iterations.numpy()) == 1


def test_user_wrapped_optimizer_is_kept_by_compile(hvd, float16_policy) -> None:
    import keras

    opt = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)))
    model = small_model()
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt
    assert fit(hvd, model) == []
    # the inner optimizer counts the steps (Keras 3.8's LossScaleOptimizer.iterations stays 0)
    assert int(opt.inner_optimizer.iterations.numpy()) == 3 and float(opt.dynamic_scale.numpy()) == 2.0**15


def test_saved_model_loads_with_keras_and_with_hvdk8s(hvd, float16_policy, tmp_path: Path) -> None:
    """Keras saves the optimizer given to compile and wraps it again on loading; hvdk8s.load_model's trains on."""
    import keras

    from hvdk8s.train.optimizer import is_distributed, is_distributed_class, reduces_gradients

    model = small_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    fit(hvd, model)
    model.optimizer.dynamic_scale.assign(256.0)  # a state to find again
    path = tmp_path / "m.keras"
    model.save(path)

    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.LossScaleOptimizer
    assert type(plain.optimizer.inner_optimizer) is keras.optimizers.SGD
    loaded = hvd.load_model(path)
    assert reduces_gradients(loaded.optimizer) and is_distributed(loaded.optimizer.inner_optimizer)
    for opt in (plain.optimizer, loaded.optimizer):
        assert float(opt.dynamic_scale.numpy()) == 256.0
        assert int(opt.inner_optimizer.iterations.numpy()) == 3
    assert fit(hvd, loaded) == []
    assert is_distributed_class(type(loaded.optimizer))
    assert int(loaded.optimizer.inner_optimizer.iterations.numpy()) == 6
    assert float(loaded.optimizer.dynamic_scale.numpy()) == 256.0


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("built_first", [True, False])
def test_keras_wrapper_around_distributed_optimizer_in_custom_loop(hvd, float16_policy, compiled, built_first) -> None:
    """Switched over when it builds its inner optimizer: before the loop, or inside its first apply (whose
    finiteness check is then agreed across ranks)."""
    import keras
    import tensorflow as tf

    from hvdk8s.train.optimizer import is_distributed_class

    model = small_model()
    opt = keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)))
    if built_first:
        opt.build(model.trainable_variables)
        assert is_distributed_class(type(opt))

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_mean(keras.losses.mean_squared_error(y, model(x))))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    (tf.function(step) if compiled else step)(np.ones((8, 4), np.float32), np.ones((8, 1), np.float32))
    assert is_distributed_class(type(opt)) and int(opt.inner_optimizer.iterations.numpy()) == 1
