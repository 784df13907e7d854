"""What each per-batch callback costs, measured on its own inside a real ``fit``.

``python -m benchmarks.harness.callback_cost --out out/callbacks`` trains the digits CNN
(one process; Horovod initialised, so the collectives are real) once with no
callbacks and once with each hvdk8s and Horovod-API callback that has
per-batch hooks, every variant its own model, in interleaved rounds of one
epoch each (the order shuffled per round). Two figures per callback:

- **step time added**: the variant's median step minus the no-callback
  median, over the rounds. This is what training pays, including work that
  lands outside the callback's own hooks (a rate assigned per batch, the
  in-step momentum correction, the wait for a step before an eager op);
- **time in its hooks**: the seconds spent inside its per-batch hooks, per batch.

A second model trained without callbacks is measured the same way: its
"step time added" is the noise floor of the comparison. Every model, the
baseline's too, has hvdk8s's lean step call (``hvdk8s.train.fit_step``), which
``BroadcastGlobalVariablesCallback`` and the rate callbacks install.

Steps are timed inside ``fit``, from the second batch's start to the last
batch's end, so ``fit``'s own per-call set-up is left out. A callback above
1% of a step is one the training loop pays for. The first epoch of each
variant (tracing, building the optimizer) is untimed. JSON, Markdown and a
bar chart.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic, figures

HOOKS = ("on_train_batch_begin", "on_train_batch_end")
BASELINE = "no callbacks"
CONTROL = "no callbacks, a second model (the noise floor)"


class Timed:
    """Wraps a callback: forwards every hook, adds up the seconds spent in its per-batch ones."""

    def __init__(self, callback: Any) -> None:
        self.callback, self.seconds = callback, 0.0

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

                    return timed
                return super().__getattribute__(attr)

        return _Proxy()


def _candidates(hvd: Any, epochs: int) -> dict[str, Any]:
    """name -> a factory of the callback for a model (the elastic ones need a state of that model)."""
    return {
        "BroadcastGlobalVariablesCallback": lambda model: hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        "MetricAverageCallback": lambda model: hvd.callbacks.MetricAverageCallback(),
        "LearningRateWarmupCallback (during warm-up)": lambda model: hvd.callbacks.LearningRateWarmupCallback(
            0.01, warmup_epochs=epochs + 1),
        "TrainingMetrics (Prometheus)": lambda model: hvd.TrainingMetrics(port=0),
        "ProgressBar (rank 0)": lambda model: hvd.ProgressBar(file=open("/dev/null", "w")),  # noqa: SIM115
        "elastic.UpdateBatchStateCallback": lambda model: hvd.elastic.UpdateBatchStateCallback(
            hvd.elastic.KerasState(model, epoch=0, batch=0)),
        "elastic.CommitStateCallback(batches_per_commit=1)": lambda model: hvd.elastic.CommitStateCallback(
            hvd.elastic.KerasState(model, epoch=0, batch=0)),
    }


def measure(steps: int, rounds: int, batch: int) -> dict[str, Any]:
    import hvdk8s as hvd

    hvd.init(quiet=True)
    import keras

    from hvdk8s.train import fit_step

    (x, y), _ = hvd.data.load_digits()
    n = steps * batch

    def compiled() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = hvd.models.cnn("cnn", input_shape=x.shape[1:])
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                      "sparse_categorical_crossentropy", metrics=["accuracy"])
        fit_step.install(model)  # as hvdk8s's callbacks do: no variant's figure is that call's saving
        return model

    class Mark(keras.callbacks.Callback):
        """``perf_counter`` at batch 1's start (``start``, first in the list) or the last batch's end (last in it)."""

        def __init__(self, times: list[float], start: bool) -> None:
            super().__init__()
            self.times, self.start = times, start

        def on_train_batch_begin(self, b: int, logs: Any = None) -> None:
            if self.start and b == 1:
                self.times.append(time.perf_counter())

        def on_train_batch_end(self, b: int, logs: Any = None) -> None:
            if not self.start and b == steps - 1:
                self.times.append(time.perf_counter())

    variants: dict[str, tuple[keras.Model, Timed | None]] = {BASELINE: (compiled(), None), CONTROL: (compiled(), None)}
    for name, make in _candidates(hvd, rounds).items():
        model = compiled()
        variants[name] = (model, Timed(make(model)))
    step_ms: dict[str, list[float]] = {name: [] for name in variants}
    hook_s = {name: 0.0 for name in variants}
    for timed_round in range(rounds + 1):  # round 0: tracing, untimed
        order = list(variants)
        random.Random(timed_round).shuffle(order)  # no variant always runs right after another
        for name in order:
            model, timer = variants[name]
            before = timer.seconds if timer else 0.0
            marks: list[float] = []
            model.fit(x[:n], y[:n], batch_size=batch, epochs=timed_round + 1, initial_epoch=timed_round, verbose=0,
                      shuffle=False, callbacks=[Mark(marks, start=True),
                                                *([timer.wrap()] if timer else []),
                                                Mark(marks, start=False)])
            if timed_round:
                step_ms[name].append((marks[1] - marks[0]) / (steps - 1) * 1e3)
                hook_s[name] += (timer.seconds - before) if timer else 0.0
    base = statistics.median(step_ms[BASELINE])
    out = {}
    for name in variants:
        if name == BASELINE:
            continue
        added = statistics.median(step_ms[name]) - base
        out[name] = {"added_ms_per_step": added, "added_share": added / base,
                     "hook_us_per_batch": hook_s[name] / (rounds * steps) * 1e6, "step_ms": step_ms[name]}
    return {"baseline_step_ms": base, "baseline_steps_ms": step_ms[BASELINE], "steps_per_epoch": steps,
            "rounds": rounds, "batch": batch, "callbacks": out}


def markdown(result: dict[str, Any], plot_name: str) -> str:
    rows = sorted(result["callbacks"].items(), key=lambda kv: -kv[1]["added_share"])
    spread = statistics.quantiles(result["baseline_steps_ms"], n=4)
    return "\n".join([
        "# Per-batch callback cost",
        "",
        f"Digits CNN, batch {result['batch']}, 1 process, {result['rounds']} interleaved rounds of one "
        f"{result['steps_per_epoch']}-batch epoch per variant. Step without callbacks: median "
        f"{result['baseline_step_ms']:.2f} ms [IQR {spread[0]:.2f}–{spread[2]:.2f}]; differences smaller than that "
        "spread are noise.",
        "",
        "| callback | step time added, ms | share of a step | time in its hooks, µs per batch |",
        "|---|---|---|---|",
        *[f"| {name} | {v['added_ms_per_step']:+.3f} | {100 * v['added_share']:+.2f}% | "
          f"{v['hook_us_per_batch']:.1f} |" for name, v in rows],
        "",
        f"![share of a step]({plot_name})",
        "",
    ])


def report(result: dict[str, Any], out: Path) -> None:
    plt = figures.pyplot()

    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(result["callbacks"].items(), key=lambda kv: kv[1]["added_share"])
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([n for n, _ in rows], [100 * v["added_share"] for _, v in rows], label="step time added")
    ax.barh([n for n, _ in rows], [100 * v["hook_us_per_batch"] / 1e3 / result["baseline_step_ms"] for _, v in rows],
            height=0.3, label="time in its hooks")
    ax.axvline(1.0, color="red", linestyle="--", label="1% of a step")
    ax.set_xlabel("% of the step without callbacks")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figures.save_figure(fig, out / "callbacks.png")
    atomic.write_json(out / "callbacks.json", result)
    text = markdown(result, "callbacks.png")
    atomic.write_text(out / "callbacks.md", text)
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--rounds", type=int, default=8, help="timed epochs per variant, interleaved")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", type=Path, default=Path("out/callbacks"))
    args = p.parse_args()
    if args.steps < 2 or min(args.rounds, args.batch) < 1:
        p.error("--steps must be at least 2, --rounds and --batch at least 1")
    report(measure(args.steps, args.rounds, args.batch), args.out)


if __name__ == "__main__":
    main()
