"""The pipeline as ONE DAG of steps, from which both executors are built.

``build(pipeline)`` gives the steps and their dependencies; ``argo.render``
turns them into Argo Workflow tasks, ``local.run`` runs them on this machine.
What a step runs is also decided here, once: the ``*_argv`` functions build
the same ``hvdk8s`` command lines for both, given a ``Layout`` that says where
the run's files are (the shared volume on the cluster, a folder locally) and
where the model is served.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hvdk8s.pipeline.spec import Candidate, Pipeline

INGEST, TRAIN, SELECT, DEPLOY, LOADTEST = "ingest", "train", "select", "deploy", "loadtest"


@dataclass(frozen=True)
class Step:
    """One node. ``needs``: steps that must have succeeded first. ``after``: steps that
    must have finished, successfully or not (select runs over the candidates that finished)."""

    name: str
    kind: str
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    candidate: Candidate | None = None

    @property
    def upstream(self) -> tuple[str, ...]:
        return self.needs + self.after


@dataclass(frozen=True)
class Dag:
    pipeline: Pipeline
    steps: tuple[Step, ...]

    def step(self, name: str) -> Step:
        return next(step for step in self.steps if step.name == name)

    def edges(self) -> set[tuple[str, str, bool]]:
        """(upstream, step, whether the upstream must have succeeded): what both executors must honour."""
        return {(up, st.name, up in st.needs) for st in self.steps for up in st.upstream}

    def waves(self) -> Iterator[tuple[Step, ...]]:
        """Steps in dependency order, grouped: every step of a wave can run at once."""
        done: set[str] = set()
        left = list(self.steps)
        while left:
            wave = tuple(st for st in left if set(st.upstream) <= done)
            if not wave:  # build() never makes a cycle; guard against a hand-made Dag
                raise ValueError(f"dependency cycle among {[st.name for st in left]}")
            yield wave
            done |= {st.name for st in wave}
            left = [st for st in left if st.name not in done]


def build(pipeline: Pipeline) -> Dag:
    """ingest and the candidates start together; select waits for all of them; then deploy, load test."""
    trains = tuple(Step(train_step(c), TRAIN, candidate=c) for c in pipeline.candidates)
    steps = (
        Step(INGEST, INGEST),
        *trains,
        Step(SELECT, SELECT, needs=(INGEST,), after=tuple(t.name for t in trains)),
        Step(DEPLOY, DEPLOY, needs=(SELECT,)),
        Step(LOADTEST, LOADTEST, needs=(DEPLOY,)),
    )
    return Dag(pipeline, steps)


def train_step(candidate: Candidate) -> str:
    return f"train-{candidate.name}"


@dataclass(frozen=True)
class Layout:
    """Where one run's files are: ``run_dir`` holds heldout.npz and candidates/, ``models`` the
    serving versions (kept across runs), ``data_root`` is what data paths are relative to."""

    run_dir: str
    models: str
    data_root: str

    @property
    def heldout(self) -> str:
        return f"{self.run_dir}/heldout.npz"

    @property
    def candidates(self) -> str:
        return f"{self.run_dir}/candidates"

    def model_file(self, candidate: Candidate) -> str:
        return f"{self.candidates}/{candidate.name}.keras"


def ingest_argv(pipeline: Pipeline, layout: Layout) -> list[str]:
    """Write the held-out set as ``heldout.npz`` (arrays x, y) for select."""
    data = pipeline.data
    argv = ["hvdk8s", "pipeline", "ingest", "--source", data.source, "--split", data.split,
            "--image-size", str(data.image_size), "--color-mode", data.color_mode, "--out", layout.heldout]
    if data.path:
        argv += ["--path", f"{layout.data_root}/{data.path}"]
    if data.name:
        argv += ["--name", data.name]
    return argv


def train_command(candidate: Candidate, layout: Layout) -> list[str]:
    """The candidate's training command, told where to save its model (the script must take --save)."""
    return [*candidate.job.command, "--save", layout.model_file(candidate)]


def select_argv(pipeline: Pipeline, layout: Layout) -> list[str]:
    """Evaluate the candidates that finished; export the best as the next serving version."""
    argv = ["hvdk8s", "select", layout.candidates, "--base-path", layout.models, "--metric", pipeline.metric,
            "--data", layout.heldout]
    if pipeline.serving.class_names:
        argv += ["--class-names", ",".join(pipeline.serving.class_names)]
    return argv


def loadtest_argv(pipeline: Pipeline, url: str, json_out: str | None = None,
                  plot_out: str | None = None) -> list[str]:
    """``hvdk8s loadtest``: exits 1 when an objective is missed, which fails the step."""
    lt = pipeline.load_test
    argv = ["hvdk8s", "loadtest", url, "--model", pipeline.serving.model_name, "--concurrency", str(lt.concurrency),
            "--requests", str(lt.requests), "--images", str(lt.images)]
    if lt.max_p99_ms is not None:
        argv += ["--max-p99-ms", f"{lt.max_p99_ms:g}"]
    if lt.max_error_rate is not None:
        argv += ["--max-error-rate", f"{lt.max_error_rate:g}"]
    if json_out:
        argv += ["--json", json_out]
    if plot_out:
        argv += ["--plot", plot_out]
    return argv
