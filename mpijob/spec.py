"""The typed model of an hvdk8s training job (what a job-spec YAML file holds).

Field names are snake_case here and camelCase in the YAML file
(``slots_per_worker`` <-> ``slotsPerWorker``), like Kubernetes objects. Every
field has a default that works on a real cluster except ``name``, ``image``
and ``command``; ``parse.from_mapping`` fills them, ``validate`` checks them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Where the MPI Operator mounts the hostfile and discover_hosts.sh (its
# ConfigMap), and the Open MPI flavour hvdk8s's mpirun flags are written for.
MPI_CONFIG_DIR = "/etc/mpi"
DISCOVER_HOSTS = f"{MPI_CONFIG_DIR}/discover_hosts.sh"
GPU_RESOURCE = "nvidia.com/gpu"
LAUNCHER_CONTAINER = "launcher"
WORKER_CONTAINER = "worker"


@dataclass(frozen=True)
class Resources:
    """CPU and memory of one pod: both requested and limited (Guaranteed QoS,
    so a busy node evicts other pods before a training rank)."""

    cpu: str
    memory: str


@dataclass(frozen=True)
class PodResources:
    worker: Resources = Resources(cpu="2", memory="4Gi")
    # mpirun (or horovodrun's driver) and ssh only: small, and never a GPU.
    launcher: Resources = Resources(cpu="500m", memory="1Gi")


@dataclass(frozen=True)
class SharedVolume:
    """A ReadWriteMany PersistentVolumeClaim (data, checkpoints, the saved
    model) mounted at the same path in the launcher and every worker, so any
    rank can read the data and a restarted job finds rank 0's checkpoints."""

    claim_name: str
    mount_path: str = "/shared"
    read_only: bool = False


@dataclass(frozen=True)
class Toleration:
    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@dataclass(frozen=True)
class Scheduling:
    """Where workers may run on a heterogeneous cluster.

    ``gpu_product`` pins workers to one GPU model (the GPU Feature Discovery
    label ``nvidia.com/gpu.product``), ``priority_class_name`` lets a
    low-priority job take older or preemptible cards. ``tolerations`` default
    (for GPU jobs) to the common ``nvidia.com/gpu:NoSchedule`` taint.
    """

    gpu_product: str | None = None
    gpu_product_label: str = "nvidia.com/gpu.product"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] | None = None
    priority_class_name: str | None = None


@dataclass(frozen=True)
class SchedulingPolicy:
    """Gang scheduling (only used when the operator runs with --gang-scheduling)."""

    min_available: int | None = None
    queue: str | None = None
    priority_class: str | None = None
    schedule_timeout_seconds: int | None = None
    min_resources: dict[str, str] | None = None


@dataclass(frozen=True)
class RunPolicy:
    # Running: delete the workers (and their GPUs) as soon as the job ends.
    clean_pod_policy: str = "Running"
    # Data-parallel failures are mostly deterministic (bug, OOM): fail fast and
    # show the reason; opt in to retries, which resume from checkpoints.
    backoff_limit: int = 0
    # Keep the finished job a day for `hvdk8s status/logs`, then clean up.
    ttl_seconds_after_finished: int | None = 86400
    active_deadline_seconds: int | None = None
    scheduling_policy: SchedulingPolicy | None = None


@dataclass(frozen=True)
class RestartPolicy:
    # The operator's own defaults; it accepts only Never and OnFailure.
    launcher: str = "OnFailure"
    worker: str = "Never"


@dataclass(frozen=True)
class User:
    """Run every pod as this non-root user (the image must have it: see
    Dockerfile.gpu's MPI_USER/MPI_UID build args). Without it pods run as root."""

    uid: int
    name: str = "mpiuser"


@dataclass(frozen=True)
class Elastic:
    """Elastic Horovod: the job keeps training while workers come and go
    between the bounds (scale with ``kubectl scale``-style edits of replicas)."""

    min_workers: int
    max_workers: int


@dataclass(frozen=True)
class Metrics:
    """Prometheus wiring: rank with local rank ``i`` serves ``port + i``."""

    enabled: bool = True
    port: int = 9090
    path: str = "/metrics"


@dataclass(frozen=True)
class Horovod:
    fusion_threshold: int = 64 * 1024 * 1024  # Horovod's default tensor fusion buffer (bytes)
    timeline: str | None = None  # Chrome-trace file written by rank 0 (put it on the shared volume)


@dataclass(frozen=True)
class Nccl:
    debug: str = "WARN"


@dataclass(frozen=True)
class JobSpec:
    """One data-parallel training job: ``workers`` pods x ``slots_per_worker``
    ranks each (= GPUs per worker when ``gpu``), launched by one launcher pod."""

    name: str
    image: str
    command: tuple[str, ...]
    namespace: str | None = None  # None: kubectl's / the context's namespace decides
    image_pull_policy: str = "IfNotPresent"
    workers: int = 2
    slots_per_worker: int = 1
    gpu: bool = False
    resources: PodResources = PodResources()
    env: dict[str, str] = field(default_factory=dict)
    # /dev/shm as a memory-backed emptyDir (NCCL and data loaders need more
    # than the container runtime's 64 MiB); counts against the memory limit.
    shm_size: str | None = "1Gi"
    shared_volume: SharedVolume | None = None
    scheduling: Scheduling = Scheduling()
    run_policy: RunPolicy = RunPolicy()
    restart_policy: RestartPolicy = RestartPolicy()
    launcher_creation_policy: str = "WaitForWorkersReady"
    mpi_implementation: str = "OpenMPI"
    user: User | None = None
    ssh_auth_mount_path: str | None = None  # default: the user's ~/.ssh
    ssh_port: int = 2222  # sshd port baked into the image (the operator's convention)
    elastic: Elastic | None = None
    metrics: Metrics = Metrics()
    horovod: Horovod = Horovod()
    nccl: Nccl = Nccl()

    @property
    def np(self) -> int:
        """Ranks at start: the operator's hostfile gives each worker ``slotsPerWorker`` slots."""
        return self.workers * self.slots_per_worker

    @property
    def home(self) -> str:
        return f"/home/{self.user.name}" if self.user else "/root"
