"""The typed model of a pipeline file: data, shared volume, candidates, selection, serving, load test.

Field names are snake_case here and camelCase in the YAML file, read strictly
by ``hvdk8s.mpijob.parse`` like job specs (unknown keys refused by name).
``load.load_pipeline`` builds a ``Pipeline`` with every candidate's job spec
parsed, defaulted and checked, so nothing downstream re-validates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hvdk8s.mpijob.spec import JobSpec, SharedVolume
from hvdk8s.serving.kube.options import TF_SERVING_VERSION, Autoscaling, Batching, Resources

DATA_SOURCES = ("digits", "imageFolder", "tfds")
COLOR_MODES = ("grayscale", "rgb")


@dataclass(frozen=True)
class Data:
    """Where the held-out images for selection come from.

    ``path`` (an image folder, or the TFDS ``data_dir``) is relative to the
    shared volume on the cluster and to the pipeline file's folder locally.
    """

    source: str = "digits"
    path: str | None = None
    name: str | None = None  # the TFDS dataset
    split: str = "test"
    image_size: int = 28  # models' input side; the digits examples train on 28x28
    color_mode: str = "grayscale"


@dataclass(frozen=True)
class CandidateEntry:
    """A candidate as written, besides its inline ``job`` mapping (read by ``load``):
    a name and, instead of ``job``, a job-spec file (``jobFile``)."""

    name: str
    job_file: str | None = None


@dataclass(frozen=True)
class Selection:
    metric: str = "accuracy"


@dataclass(frozen=True)
class Serving:
    """The serving target; the model source is the pipeline's shared volume."""

    model_name: str
    kserve: bool = False
    class_names: tuple[str, ...] | None = None
    tf_serving_version: str = TF_SERVING_VERSION
    resources: Resources = field(default_factory=Resources)
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    batching: Batching | None = None
    logger_url: str | None = None
    logger_mode: str = "all"


@dataclass(frozen=True)
class LoadTestFile:
    """``loadTest`` as written. The two objectives are declared as text (the strict reader gives a
    number as its text), and ``load`` turns them into numbers and checks their range."""

    concurrency: int = 4
    requests: int = 200
    images: int = 8
    max_p99_ms: str | None = None
    max_error_rate: str | None = None


@dataclass(frozen=True)
class LoadTest:
    concurrency: int = 4
    requests: int = 200
    images: int = 8
    max_p99_ms: float | None = None
    max_error_rate: float | None = None


@dataclass(frozen=True)
class Deadlines:
    """The Argo Workflow only: how long its steps wait before they fail, in minutes (every wait is bounded).

    Under ``WaitForWorkersReady`` the MPI Operator creates a candidate's launcher only once every
    worker is Ready, and the MPIJob's ``activeDeadlineSeconds`` reaches only that launcher Job: a
    worker that is unschedulable, stuck pulling its image or crash-looping would otherwise leave
    the train step waiting forever.
    """

    launcher_minutes: int = 30  # a candidate's MPIJob still has no launcher: its workers never all got Ready
    train_minutes: int = 720  # its launcher exists (or waits in a queue) and training has not ended
    deploy_minutes: int = 15  # the model server is not ready


@dataclass(frozen=True)
class Local:
    """``hvdk8s pipeline run`` only: ranks per candidate (the cluster uses each job's workers x slots)."""

    ranks: int = 2


@dataclass(frozen=True)
class PipelineFile:
    """The top level of a pipeline file, as written, besides ``candidates`` (read by ``load``)."""

    name: str
    image: str
    shared_volume: SharedVolume
    serving: Serving
    namespace: str | None = None
    data: Data = Data()
    selection: Selection = Selection()
    load_test: LoadTestFile = LoadTestFile()
    deadlines: Deadlines = Deadlines()
    local: Local = Local()


@dataclass(frozen=True)
class Candidate:
    """One candidate: its name in the pipeline and its checked training job."""

    name: str
    job: JobSpec


@dataclass(frozen=True)
class Pipeline:
    """A checked pipeline: what both executors are built from."""

    name: str
    image: str
    namespace: str | None
    shared_volume: SharedVolume
    data: Data
    candidates: tuple[Candidate, ...]
    metric: str
    serving: Serving
    load_test: LoadTest
    deadlines: Deadlines
    local: Local
