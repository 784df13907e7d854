"""What each per-batch callback costs, measured on its own inside a real ``fit``.

``python -m benchmarks.callback_cost --out out/callbacks`` trains the digits CNN
(one process; Horovod initialised, so the collectives are real) with every
hvdk8s and Horovod-API callback that has per-batch hooks, each wrapped so the
time spent in its own hooks is measured, and reports it per batch and as a
share of the mean step next to the step itself. A callback above 1% of a step
is one the training loop pays for. JSON, Markdown and a bar chart.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

HOOKS = ("on_train_batch_begin", "on_train_batch_end")


class Timed:
    """Wraps a callback: forwards every hook, adds up the seconds spent in its per-batch ones."""

    def __init__(self, name: str, callback: Any) -> None:
        self.name, self.callback, self.seconds, self.calls = name, callback, 0.0, 0

    def wrap(self) -> Any:
        import keras

        timer = self

        class _Proxy(keras.callbacks.Callback):
            def set_model(self, model: Any) -> None:
                timer.callback.set_model(model)

            def set_params(self, params: dict) -> None:
                timer.callback.set_params(params)

            def __getattribute__(self, attr: str) -> Any:
                if attr.startswith("on_"):
                    hook = getattr(timer.callback, attr)
                    if attr not in HOOKS:
                        return hook

                    def timed(*args: Any, **kwargs: Any) -> Any:
                        start = time.perf_counter()
                        try:
                            return hook(*args, **kwargs)
                        finally:
                            timer.seconds += time.perf_counter() - start
                            timer.calls += 1

                    return timed
                return super().__getattribute__(attr)

        return _Proxy()


def measure(steps: int, epochs: int, batch: int) -> dict[str, Any]:
    import hvdk8s as hvd

    hvd.init(quiet=True)
    import keras
    import numpy as np

    (x, y), _ = hvd.data.load_digits()
    model = hvd.models.cnn("cnn", input_shape=x.shape[1:])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                  "sparse_categorical_crossentropy", metrics=["accuracy"])
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    candidates = {
        "BroadcastGlobalVariablesCallback": hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        "MetricAverageCallback": hvd.callbacks.MetricAverageCallback(),
        "LearningRateWarmupCallback (during warm-up)": hvd.callbacks.LearningRateWarmupCallback(
            0.01, warmup_epochs=epochs + 1),
        "TrainingMetrics (Prometheus)": hvd.TrainingMetrics(port=0),
        "ProgressBar (rank 0)": hvd.ProgressBar(file=open("/dev/null", "w")),  # noqa: SIM115
        "elastic.UpdateBatchStateCallback": hvd.elastic.UpdateBatchStateCallback(state),
        "elastic.CommitStateCallback(batches_per_commit=1)": hvd.elastic.CommitStateCallback(state),
    }
    timers = [Timed(name, cb) for name, cb in candidates.items()]

    class StepClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.begin, self.steps = 0.0, []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.begin = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps.append(time.perf_counter() - self.begin)

    clock = StepClock()
    n = steps * batch
    model.fit(x[:n], y[:n], batch_size=batch, epochs=epochs, verbose=0, shuffle=False,
              callbacks=[t.wrap() for t in timers] + [clock])
    step = float(np.median(clock.steps[steps:]))  # the first epoch holds tracing
    batches = steps * epochs
    return {
        "step_seconds_median": step,
        "batches": batches,
        "callbacks": {t.name: {"seconds_per_batch": t.seconds / batches, "share_of_step": t.seconds / batches / step}
                      for t in timers},
    }


def report(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(result["callbacks"].items(), key=lambda kv: -kv[1]["seconds_per_batch"])
    lines = [
        "# Per-batch callback cost",
        "",
        f"Median step (digits CNN, batch {result['batch']}, 1 process): "
        f"{result['step_seconds_median'] * 1e3:.2f} ms over {result['batches']} batches.",
        "",
        "| callback | µs per batch | share of a step |",
        "|---|---|---|",
        *[f"| {name} | {v['seconds_per_batch'] * 1e6:.1f} | {100 * v['share_of_step']:.2f}% |" for name, v in rows],
        "",
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "callbacks.json").write_text(json.dumps(result, indent=2))
    (out / "callbacks.md").write_text("\n".join(lines))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([n for n, _ in rows], [100 * v["share_of_step"] for _, v in rows])
    ax.axvline(1.0, color="red", linestyle="--", label="1% of a step")
    ax.set_xlabel("% of the median step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "callbacks.png", dpi=120)
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", type=Path, default=Path("out/callbacks"))
    args = p.parse_args()
    result = measure(args.steps, args.epochs, args.batch)
    result["batch"] = args.batch
    report(result, args.out)


if __name__ == "__main__":
    main()
