"""Where a step's time goes, for hvdk8s (Keras fit) and the raw Horovod loop, at N ranks.

A profiling-only build: each phase is its own compiled function on a copy of
the same model, timed alone, rather than ``tf.timestamp`` brackets inside the
real step (brackets order the ops and would hide the very overlap being
measured). Phases, per step:

* input: a tf.function that only calls ``next`` on the dataset iterator;
* forward+backward: loss and gradients of one batch, no communication;
* optimizer: applying a fixed set of gradients, each harness with its own
  optimizer: Keras's SGD for the raw loop, hvdk8s's ``DistributedOptimizer``
  (its fused SGD update) for hvdk8s, through Keras's ``apply`` so that its
  gradient reduction is left out;
* allreduce alone: one allreduce per gradient, as both steps issue them
  (Horovod's tensor fusion batches the ready ones), with nothing else
  running, i.e. what communication costs when nothing hides it;
* compiled step: the raw loop's step function, or for hvdk8s the model's
  public ``train_step`` in one ``tf.function``, as the raw loop's step is;
* allreduce wait = compiled step - (input + forward+backward + its optimizer):
  the communication that compute did not hide, plus any glue in the step
  (Keras's loss tracker for hvdk8s);
* fit's step call = the model's ``train_function`` called directly (what
  ``fit`` calls per step: hvdk8s's lean call, ``hvdk8s.train.fit_step``) - that
  compiled ``train_step``: the per-call work around ``train_step``, measured
  on the same model;
* callbacks and fit loop = hvdk8s's ``fit`` window - its ``train_function``.

All phases are timed round-robin between hvdk8s's ``fit`` windows, so drift
in machine load hits them alike. Afterwards a few hvdk8s steps run under
Horovod's timeline (``hvd.start_timeline``); rank 0 keeps the spans of its
gradient tensors for the report's timeline picture.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config.settings import Settings

TIMELINE_STEPS = 6


def _per_step(fn: Callable[[], Any], steps: int) -> float:
    out = None
    start = time.perf_counter()
    for _ in range(steps):
        out = fn()
    if out is not None:
        import tensorflow as tf

        tf.nest.map_structure(lambda t: t.numpy(), out)
    return (time.perf_counter() - start) / steps


def phases(s: Settings, workload_name: str, seed: int, timeline: Path | None) -> dict[str, Any]:
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    import hvdk8s

    from . import trainers, workloads

    wl = s.workload(workload_name)

    def model_fn() -> Any:
        return workloads.build_model(wl, seed)

    def data(rank: int, size: int, _seed: Any) -> tf.data.Dataset:
        return workloads.synthetic_dataset(wl, wl.batch_per_rank, seed + rank)

    hv = trainers.KerasFitTrainer(model_fn, data, 0.001, use_hvdk8s=True)
    raw = trainers.HorovodLoopTrainer(model_fn, data, 0.001)

    model = model_fn()
    opt = workloads.optimizer(0.001)
    opt.build(model.trainable_variables)
    loss_fn = workloads.per_example_loss()
    it = iter(data(hvd.rank(), hvd.size(), None))
    x, y = next(it)

    @tf.function
    def forward_backward(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        return tape.gradient(loss, model.trainable_variables)

    grads = forward_backward(x, y)
    hv_opt = hvdk8s.DistributedOptimizer(workloads.optimizer(0.001))
    hv_opt.build(model.trainable_variables)
    input_only = tf.function(lambda: next(it))
    optimizer_only = tf.function(lambda: opt.apply(grads, model.trainable_variables))
    # Keras's apply on the distributed optimizer: its own update (fused for SGD) without the reduction
    hv_optimizer_only = tf.function(lambda: keras.optimizers.Optimizer.apply(hv_opt, grads, model.trainable_variables))
    allreduce_only = tf.function(
        lambda: [hvd.allreduce(g, op=hvd.Average, name=f"profile.allreduce.{i}") for i, g in enumerate(grads)])
    hv_it = iter(hv.data)
    hv_train_step = tf.function(lambda: hv.model.train_step(next(hv_it)))
    fns: dict[str, Callable[[], Any]] = {
        "input": input_only,
        "forward_backward": lambda: forward_backward(x, y),
        "optimizer": optimizer_only,
        "hvdk8s_optimizer": hv_optimizer_only,
        "allreduce_alone": allreduce_only,
        "raw_step": lambda: raw._step(raw._it),
        "hvdk8s_train_step": hv_train_step,
        "hvdk8s_step": lambda: hv.model.train_function(hv_it),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    warm = [False]

    def round_robin() -> None:
        for name, fn in fns.items():
            if not warm[0]:
                _per_step(fn, s.warmup_steps)
                continue
            times[name].append(_per_step(fn, s.profile_steps))
        warm[0] = True

    # train_function exists once fit has started: the first between() call comes after fit's warm-up
    fit_windows = hv.timed(s.warmup_steps, s.profile_steps, s.windows * s.models, round_robin)
    times["hvdk8s_fit"] = [w / s.profile_steps for w in fit_windows]
    out: dict[str, Any] = {
        "workload": wl.name,
        "params": int(sum(int(v.numpy().size) for v in model.trainable_variables)),
        "steps": s.profile_steps,
        "seconds_per_step": times,
    }
    if timeline is not None:
        hvd.start_timeline(str(timeline), mark_cycles=False)
        hv.timed(1, TIMELINE_STEPS, 1)
        hvd.stop_timeline()
        if hvd.rank() == 0:
            out["timeline"] = timeline_spans(read_timeline(timeline))
    return out


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """Events of a Horovod timeline file; a file cut off mid-array (as Horovod leaves it) is closed first."""
    text = path.read_text().strip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def timeline_spans(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tensor (Horovod names each timeline row after one), its top-level spans: activity, start, end (µs)."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_spans: dict[int | None, list[tuple[str, float]]] = {}  # by Chrome-trace pid: one per tensor
    spans = []
    for e in events:
        pid, ph = e.get("pid"), e.get("ph")
        if ph == "B":
            open_spans.setdefault(pid, []).append((e.get("name", ""), float(e["ts"])))
        elif ph == "E" and open_spans.get(pid):
            name, start = open_spans[pid].pop()
            spans.append({"tensor": names.get(pid, str(pid)), "activity": name, "depth": len(open_spans[pid]),
                          "start_us": start, "end_us": float(e["ts"])})
    return {"spans": spans}
