"""hvdk8s as ``horovod.tensorflow.keras``: Horovod's names and signatures, its numbers on 2 real ranks,
and Horovod's own Keras test file (Keras 3 edition, ../shared/peer/horovod) passing unchanged."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_ranks, shared

# Horovod module attributes that are imports, not API.
NOT_API = {"K", "keras", "tf", "inspect", "version", "warnings", "is_version_greater_equal_than", "callbacks", "elastic"}


def horovod_names(module) -> list[str]:
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    return sorted(n for n in dir(module) if not n.startswith("_") and n not in NOT_API
                  and not inspect.ismodule(getattr(module, n)))


def params(fn) -> list[tuple[str, object]]:
    """Positional-or-keyword parameters (a ``*args, **kwargs`` wrapper such as Horovod's ``init`` has none)."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def same_default(a: object, b: object) -> bool:
    return a is b or a == b or (getattr(a, "process_set_id", None) is not None and
                                getattr(a, "process_set_id", None) == getattr(b, "process_set_id", None))


@pytest.mark.parametrize("module", ["horovod.tensorflow.keras", "horovod.tensorflow.keras.callbacks",
                                    "horovod.tensorflow.keras.elastic", "horovod.keras"])
def test_every_horovod_keras_name_exists_with_horovods_positional_signature(module: str) -> None:
    import importlib

    import hvdk8s

    theirs = importlib.import_module(module)
    ours = {"horovod.tensorflow.keras": hvdk8s, "horovod.keras": hvdk8s,
            "horovod.tensorflow.keras.callbacks": hvdk8s.callbacks,
            "horovod.tensorflow.keras.elastic": hvdk8s.elastic}[module]
    tf_keras_names = set(horovod_names(importlib.import_module("horovod.tensorflow.keras")))
    for name in horovod_names(theirs):
        assert hasattr(ours, name), f"{module}.{name} is missing from hvdk8s"
        mine, horovods = getattr(ours, name), getattr(theirs, name)
        if module == "horovod.keras" and name in tf_keras_names:
            continue  # hvdk8s follows horovod.tensorflow.keras where Horovod's two Keras layers differ
        if not callable(horovods) or name in {"ProcessSet", "Compression", "KerasState", "run"}:
            continue
        if inspect.isclass(horovods):
            mine, horovods = mine.__init__, horovods.__init__
        assert_horovods_params(f"{module}.{name}", params(mine), params(horovods))


def assert_horovods_params(name: str, mine: list[tuple[str, object]], horovods: list[tuple[str, object]]) -> None:
    """``mine`` starts with Horovod's positional parameters, in its order, with its defaults (or a default where
    Horovod's is required, as the tape's ``gradtape``: every Horovod call still means the same)."""
    got = mine[: len(horovods)]
    assert [n for n, _ in got] == [n for n, _ in horovods], f"{name}: {got} != {horovods}"
    for (n, d_mine), (_, d_theirs) in zip(got, horovods):
        assert d_theirs is inspect.Parameter.empty or same_default(d_mine, d_theirs), \
            f"{name}({n}=...): default {d_mine!r} != {d_theirs!r}"


def test_distributed_gradient_tape_has_horovods_signatures() -> None:
    """``horovod.tensorflow.DistributedGradientTape`` (a function returning a ``_DistributedGradientTape``) and its
    ``gradient``, which a ported custom loop calls with Horovod's arguments."""
    import horovod.tensorflow

    import hvdk8s

    assert_horovods_params("DistributedGradientTape", params(hvdk8s.DistributedGradientTape.__init__)[1:],
                           params(horovod.tensorflow.DistributedGradientTape))
    assert_horovods_params("DistributedGradientTape.gradient", params(hvdk8s.DistributedGradientTape.gradient),
                           params(horovod.tensorflow._DistributedGradientTape.gradient))


def test_horovod_callbacks_and_elastic_are_reachable_as_attributes() -> None:
    import hvdk8s as hvd

    assert hvd.callbacks.BroadcastGlobalVariablesCallback.__module__ == "hvdk8s.callbacks"
    assert hvd.elastic.CommitStateCallback.__module__ == "hvdk8s.elastic"
    assert callable(hvd.default_callbacks)  # hvdk8s's own list under a name Horovod does not use


@pytest.fixture(scope="module")
def semantics(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("semantics")
    run_ranks(2, "horovod_semantics.py", str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_init_takes_mpi4py_communicators_and_a_step_traced_at_size_1_reduces_after_growth(semantics) -> None:
    r0, r1 = semantics
    assert r0["size_before_growth"] == 1
    assert r0["update_at_size_1"] == [1.0, 0.0] and r1["update_at_size_1"] == [1.0, 1.0]  # each its own
    assert r0["update_after_growth"] == r1["update_after_growth"] == [1.0, 0.5]  # same traced step, averaged
    assert (r0["size"], r0["cross_size"], r0["cross_rank"], r0["is_initialized"]) == (2, 1, 0, True)


def test_reduction_ops_match_horovods_arithmetic(semantics) -> None:
    a, b = (np.array(r["grad"]) for r in semantics)
    for r in semantics:
        np.testing.assert_allclose(r["average"], (a + b) / 2)
        np.testing.assert_allclose(r["predivide"], (a + b) / 2, rtol=1e-6)  # split around the sum, same mean
        np.testing.assert_allclose(r["sum"], a + b)
        # Adasum of two vectors (Maleki et al. 2021, Horovod's definition)
        dot = a @ b
        adasum = (1 - dot / (2 * a @ a)) * a + (1 - dot / (2 * b @ b)) * b
        np.testing.assert_allclose(r["adasum"], adasum, rtol=1e-6)
        assert "groups=None" in r["adasum_groups_error"]
    # a process set of one rank reduces nothing: each rank applies its own gradient
    assert semantics[0]["own_process_set"] == semantics[0]["grad"]
    assert semantics[1]["own_process_set"] == semantics[1]["grad"]


def test_grouping_changes_how_gradients_travel_not_the_result(semantics) -> None:
    for r in semantics:
        assert r["groups_match"] == {"groups=2": 0.0, "num_groups=3": 0.0, "groups=6": 0.0}
    assert semantics[0]["weights_fit"] == semantics[1]["weights_fit"]


def test_sparse_gradients_are_allgathered_unless_sparse_as_dense(semantics) -> None:
    # rank r looks up rows [r, 3] with weight r+1: rows 0 and 1 get (1, 2)/2, row 3 gets (1+2)/2
    expected = [[0.5, 0.5], [1.0, 1.0], [0, 0], [1.5, 1.5], [0, 0], [0, 0]]
    for r in semantics:
        assert r["sparse_grad_type"] == "IndexedSlices"
        np.testing.assert_allclose(r["sparse_allgather"], expected)
        np.testing.assert_allclose(r["sparse_as_dense"], expected)
        assert r["tape_grad"] == [1.5, 1.5]  # DistributedGradientTape(tape): mean of 1 and 2


@pytest.mark.parametrize("passes", [1, 2, 3])
@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_follow_horovods_aggregation(semantics, passes: int, average: bool) -> None:
    # pass s (1-based) on rank r has gradient s*(r+1); ranks average, passes sum (or average) per cycle
    trace = semantics[0]["aggregation"][f"{passes},{average}"]
    value, expected = 0.0, []
    for step in range(1, 8):
        if step % passes == 0:
            summed = sum(s * 1.5 for s in range(step - passes + 1, step + 1))  # mean over ranks of s*(r+1)
            value += summed / passes if average else summed
        expected.append([value, step])  # Horovod counts every pass in `iterations`
    assert trace == expected
    assert semantics[1]["aggregation"] == semantics[0]["aggregation"]


def test_learning_rate_callbacks_give_horovods_numbers_batch_by_batch(semantics) -> None:
    for r in semantics:
        for name, row in r["lr_rows"].items():
            assert len(row["hvdk8s"]) == len(row["horovod"]) == 20, name
            np.testing.assert_allclose(row["hvdk8s"], row["horovod"], rtol=1e-6, err_msg=name)
    warmup = semantics[0]["lr_rows"]["warmup 0.2 over 3 epochs"]["horovod"]
    assert warmup[0] == pytest.approx(0.2 / 2 * (1 + 0.25 / 3))  # initial_lr / size at the start ...
    assert warmup[11] == pytest.approx(0.2)  # ... initial_lr on the last batch of the last warm-up epoch


def test_model_built_during_fit_is_broadcast_and_load_model_restores_a_distributed_optimizer(semantics) -> None:
    r0, r1 = semantics
    assert r0["lazy_weights"] == r1["lazy_weights"]  # different seeds per rank, identical after fit
    for r in semantics:
        assert r["load_model"] == {"distributed": True, "iterations": 4, "class": "SGD"}
        assert len(r["plain_load_warning"]) == 1 and "hvdk8s.load_model" in r["plain_load_warning"][0]


# Earlier tests in this process have started TensorFlow, so init() cannot pin threads; it says so, as it should.
@pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")
def test_elastic_commit_callback_commits_every_n_batches_and_tracks_batch_and_epoch() -> None:
    import keras

    import hvdk8s as hvd

    hvd.init(quiet=True)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    commits: list[tuple[int, int]] = []

    class CountingState(hvd.elastic.KerasState):
        def commit(self) -> None:
            commits.append((self.epoch, self.batch))
            super().commit()

    state = CountingState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
    x = np.ones((20, 2), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=2, callbacks=callbacks, verbose=0)
    # Horovod counts batches across epochs: commits after every 2nd of the 10 batches (epoch 0 indices 1, 3;
    # epoch 1 indices 0, 2, 4) and at each epoch end (state.epoch advanced, state.batch back to 0)
    assert commits == [(0, 1), (0, 3), (1, 0), (1, 0), (1, 2), (1, 4), (2, 0)]
    assert state.epoch == 2 and state.batch == 0


@pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")
def test_tape_gradient_takes_horovods_arguments() -> None:
    """``output_gradients`` weighs the target as TensorFlow's does; ``use_generic_names`` (Horovod names its
    allreduces by it; hvdk8s names its own) is accepted, positionally too."""
    import tensorflow as tf

    import hvdk8s as hvd

    hvd.init(quiet=True)
    w = tf.Variable([1.0, 2.0])
    with hvd.DistributedGradientTape(persistent=True) as tape:
        y = w * w
    weight = tf.constant([3.0, 5.0])
    by_keyword = tape.gradient(y, [w], output_gradients=weight, use_generic_names=True)
    by_position = tape.gradient(y, [w], weight, True)
    for grads in (by_keyword, by_position):
        np.testing.assert_allclose(grads[0].numpy(), [6.0, 20.0])  # d(w*w)/dw * weight, one rank: as is


@pytest.mark.parametrize("later", [False, True], ids=["alone", "with a later schedule"])
def test_momentum_correction_is_horovods_momentum_times_new_over_old_lr_for_the_step(later: bool) -> None:
    """``later``: a second rate callback, out of its range here, must not switch the first one's correction off."""
    import keras
    import tensorflow as tf

    import hvdk8s as hvd

    hvd.init(quiet=True)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype("float32"), rng.normal(size=(40, 1)).astype("float32")

    def model() -> keras.Model:
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    def multiplier(epoch: float) -> float:
        return 0.5 + epoch

    trained = model()
    trained.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), "mse")
    trained.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier, staircase=False, momentum_correction=True),
        *([hvd.callbacks.LearningRateScheduleCallback(0.1, 1.0, start_epoch=5)] if later else [])])
    # Horovod (Keras 2): for the step where the rate changes, momentum = 0.9 × new_lr / old_lr
    ref = model()
    weights = [v.numpy() for v in ref.trainable_variables]
    velocity = [np.zeros_like(w) for w in weights]
    old_lr = 0.1
    for step in range(8):
        lr = 0.1 * multiplier(step // 4 + (step % 4) / 4)
        for v, w in zip(ref.trainable_variables, weights):
            v.assign(w)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((ref(x[step % 4 * 10:][:10]) - y[step % 4 * 10:][:10]) ** 2)
        grads = [g.numpy() for g in tape.gradient(loss, ref.trainable_variables)]
        velocity = [0.9 * lr / old_lr * v - lr * g for v, g in zip(velocity, grads)]
        weights = [w + v for w, v in zip(weights, velocity)]
        old_lr = lr
    for got, want in zip(trained.get_weights(), weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("np_", [2, 1])
def test_horovods_own_keras_test_file_passes(np_: int, tmp_path: Path) -> None:
    """The contract: Horovod's test_tensorflow2_keras.py (Keras 3 edition), unchanged, via its run.sh."""
    run_sh = shared("peer/horovod/run.sh")
    venv_bin = str(Path(os.sys.executable).parent)
    env = {**os.environ, "NP": str(np_), "PATH": f"{venv_bin}:{os.environ['PATH']}", "PEER_KEEP": str(tmp_path)}
    proc = subprocess.run(["bash", str(run_sh)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    summary = proc.stdout + proc.stderr
    assert proc.returncode == 0, summary[-4000:]
    skips = {line.split(":")[0].strip() for line in summary.splitlines() if line.strip().startswith("skip ")}
    listed = {"skip test_legacy_optimizer", "skip test_session"}  # CHANGES.md's skips
    two_rank_only = {"skip test_partial_distributed_optimizer",
                     "skip test_broadcast_global_variables_callback_with_local_vars"}  # they skip at size 1
    assert skips == (listed if np_ == 2 else listed | two_rank_only), summary
    assert "0 failed" in summary and ("12 passed" if np_ == 2 else "10 passed") in summary, summary


@pytest.mark.parametrize("groups", [0, -1])
def test_groups_that_horovod_refuses_are_refused_with_its_message(groups: int) -> None:
    """Horovod 0.28.1 refuses ``groups`` that is neither a list nor > 0, in its Keras and TensorFlow optimizers and
    its tape; so does hvdk8s (it used to take 0 as no groups)."""
    import horovod.tensorflow.keras
    import keras

    import hvdk8s

    with pytest.raises(ValueError) as horovods:
        horovod.tensorflow.keras.DistributedOptimizer(keras.optimizers.SGD(), groups=groups)
    with pytest.raises(ValueError, match=f"groups={groups}: ") as optimizer:
        hvdk8s.DistributedOptimizer(keras.optimizers.SGD(), groups=groups)
    with pytest.raises(ValueError) as tape:
        hvdk8s.DistributedGradientTape(groups=groups)
    assert str(horovods.value) in str(optimizer.value) and str(tape.value) == str(optimizer.value)


@pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")
@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_with_backward_passes_need_sparse_as_dense_as_in_horovod(sparse_as_dense: bool) -> None:
    """Horovod's aggregation helper refuses ``IndexedSlices`` with ``backward_passes_per_step`` > 1 unless
    ``sparse_as_dense=True`` (then it densifies them); hvdk8s raises Horovod's message, or sums them densified."""
    import keras
    import tensorflow as tf
    from horovod.tensorflow.gradient_aggregation_eager import LocalGradientAggregationHelperEager

    import hvdk8s as hvd

    hvd.init(quiet=True)
    table = keras.Variable(np.zeros((4, 2), "float32"))
    grad = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([0, 3]), tf.constant([4, 2]))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                   sparse_as_dense=sparse_as_dense)
    if sparse_as_dense:
        for _ in range(2):
            opt.apply([grad], [table])
        np.testing.assert_array_equal(table.numpy(), [[-2, -2], [0, 0], [0, 0], [-2, -2]])  # 2 passes summed
        return
    with pytest.raises(ValueError) as horovods:
        LocalGradientAggregationHelperEager(2, None, False, False).compute_gradients([grad], [table])
    with pytest.raises(ValueError) as ours:
        opt.apply([grad], [table])
    assert str(ours.value) == str(horovods.value)
