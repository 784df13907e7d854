"""Mixed precision on 2 ranks where only rank 0's float16 gradients overflow; writes JSON per rank.

Rank 0's first batch is scaled by ``--blowup`` so that, at Keras's initial
loss scale (2 ** 15), its local float16 backward pass overflows while rank 1's
stays finite. Each case trains a fresh seeded model for ``STEPS`` batches and
records what every rank must agree on: the decision (``iterations``, the loss
scale and its growth counter) and the weights. A case whose setup hvdk8s
refuses records the error instead.

    python mixed_precision.py OUT_DIR [CASE ...]
"""
from __future__ import annotations

import json
import sys
import traceback
import warnings
from pathlib import Path

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 4
BATCH = 16
BLOWUP = 1e3

# name: (runner, dtype policy, options)
CASES: dict[str, tuple[str, str, dict]] = {
    # fit: compile wraps the DistributedOptimizer in Keras's LossScaleOptimizer (initial scale 2**15, growth 2000)
    "fit-fp16": ("fit", "mixed_float16", {}),
    # the user wrapped it first: hvd.DistributedOptimizer(LossScaleOptimizer(opt)); growth every 2 good steps
    "fit-fp16-user-lso": ("fit", "mixed_float16", {"user_lso": True, "growth": 2}),
    # no hvdk8s callback (an elastic script's warm-up fit): Keras 3.15 builds the optimizer inside the first step
    "fit-fp16-no-callbacks": ("fit", "mixed_float16", {"no_callbacks": True}),
    "fit-fp16-passes2": ("fit", "mixed_float16", {"passes": 2}),
    "fit-fp16-compression": ("fit", "mixed_float16", {"compression": True}),
    "fit-bf16": ("fit", "mixed_bfloat16", {}),
    # custom loops
    "loop-fp16": ("loop", "mixed_float16", {"user_lso": True}),
    "loop-fp16-passes2": ("loop", "mixed_float16", {"user_lso": True, "passes": 2}),
    "loop-fp16-compression": ("loop", "mixed_float16", {"user_lso": True, "compression": True}),
    "loop-fp16-tape": ("loop", "mixed_float16", {"tape": True}),
    "loop-bf16": ("loop", "mixed_bfloat16", {}),
    # Keras's LossScaleOptimizer around a DistributedOptimizer, built before the loop (as run_loop does):
    # switched over when it builds its inner optimizer, so it reduces before deciding
    "loop-fp16-lso-of-distributed": ("loop", "mixed_float16", {"lso_of_distributed": True}),
}


def data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    x = rng.random((STEPS * BATCH, 8), dtype=np.float32)
    y = rng.random((STEPS * BATCH, 1), dtype=np.float32)
    if rank == 0:
        x[:BATCH] *= BLOWUP
    return x, y


def model_for(policy: str) -> keras.Model:
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(5)
    return keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1, dtype="float32"),
    ])


def optimizer(opts: dict) -> keras.optimizers.Optimizer:
    kwargs = {"backward_passes_per_step": opts.get("passes", 1)}
    if opts.get("compression"):
        kwargs["compression"] = hvdk8s.Compression.fp16
    sgd = keras.optimizers.SGD(0.01)
    if opts.get("user_lso"):
        return hvdk8s.DistributedOptimizer(
            keras.optimizers.LossScaleOptimizer(sgd, dynamic_growth_steps=opts.get("growth", 2000)), **kwargs
        )
    if opts.get("lso_of_distributed"):
        return keras.optimizers.LossScaleOptimizer(hvdk8s.DistributedOptimizer(sgd, **kwargs))
    if opts.get("tape"):
        return keras.optimizers.LossScaleOptimizer(sgd)
    return hvdk8s.DistributedOptimizer(sgd, **kwargs)


def locally_finite(model: keras.Model, opt: keras.optimizers.Optimizer, x: np.ndarray, y: np.ndarray) -> bool | None:
    """Whether this rank's own scaled gradients of the first batch are finite (before any training)."""
    if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return None
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y[:BATCH], model(x[:BATCH], training=True))
        scaled = tf.reduce_mean(loss) * opt.initial_scale
    grads = tape.gradient(scaled, model.trainable_variables)
    return bool(all(np.isfinite(g.numpy()).all() for g in grads))


def run_fit(model: keras.Model, opts: dict, x: np.ndarray, y: np.ndarray) -> keras.optimizers.Optimizer:
    model.compile(optimizer=optimizer(opts), loss="mse")
    opt = model.optimizer
    record["local_finite"] = locally_finite(model, opt, x, y)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callbacks = [] if opts.get("no_callbacks") else [hvdk8s.callbacks.BroadcastGlobalVariablesCallback(0)]
        model.fit(ds, epochs=1, verbose=0, callbacks=callbacks)
    record["warnings"] = [str(w.message) for w in caught if "hvdk8s" in str(w.message)]
    record["same_optimizer_object"] = model.optimizer is opt
    return model.optimizer


def run_loop(model: keras.Model, opts: dict, x: np.ndarray, y: np.ndarray) -> keras.optimizers.Optimizer:
    opt = optimizer(opts)
    opt.build(model.trainable_variables)  # so scale_loss reads the dynamic scale, not the initial constant
    hvdk8s.broadcast_variables(model.variables, root_rank=0)
    record["local_finite"] = locally_finite(model, opt, x, y)
    make_tape = hvdk8s.DistributedGradientTape if opts.get("tape") else tf.GradientTape

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        with make_tape() as tape:
            loss = tf.reduce_mean(keras.losses.mean_squared_error(yb, model(xb, training=True)))
            loss = opt.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    for i in range(STEPS):
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    return opt


def state(opt: keras.optimizers.Optimizer, model: keras.Model) -> dict:
    inner = getattr(opt, "inner_optimizer", opt)
    out = {
        "class": type(opt).__name__,
        "iterations": int(inner.iterations.numpy()),
        "weights": [w.astype("float64").ravel().tolist() for w in model.get_weights()],
    }
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        out["scale"] = float(opt.dynamic_scale.numpy())
        out["step_counter"] = int(opt.step_counter.numpy())
        out["initial_scale"] = float(opt.initial_scale)
        out["dynamic_growth_steps"] = int(opt.dynamic_growth_steps)
    return out


out = Path(sys.argv[1])
names = sys.argv[2:] or list(CASES)
results = {}
for name in names:
    runner, policy, opts = CASES[name]
    record: dict = {}
    x, y = data(hvdk8s.rank())
    model = model_for(policy)
    try:
        opt = (run_fit if runner == "fit" else run_loop)(model, opts, x, y)
        record.update(state(opt, model))
    except Exception as err:  # noqa: BLE001 - a refused setup is a result to compare
        record["error"] = f"{type(err).__name__}: {err}"
        print(f"[{name}] {traceback.format_exc()}", file=sys.stderr)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    results[name] = record
    print(f"rank {hvdk8s.rank()} {name}: " + json.dumps({k: v for k, v in record.items() if k != "weights"}))

out.mkdir(parents=True, exist_ok=True)
(out / f"rank{hvdk8s.rank()}.json").write_text(json.dumps(results))
