"""The typed model of an hvdk8s training job (what a job-spec YAML file holds).

Field names are snake_case here and camelCase in the YAML file
(``slots_per_worker`` <-> ``slotsPerWorker``), like Kubernetes objects. Every
field has a default that works on a real cluster except ``name``, ``image``
and ``command``; ``parse.from_mapping`` fills them, ``defaults`` completes them, ``validation`` checks them.
Fields that take one of a few values say which beside their type (``Literal``):
the parser refuses any other value, and the manifest checks read the same lists.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from hvdk8s.launcher.mpirun import DEFAULT_TCP_EAGER_LIMIT, AllreduceAlgorithm

# Where the MPI Operator mounts the hostfile and discover_hosts.sh (its
# ConfigMap), and the Open MPI flavour hvdk8s's mpirun flags are written for.
MPI_CONFIG_DIR = "/etc/mpi"
DISCOVER_HOSTS = f"{MPI_CONFIG_DIR}/discover_hosts.sh"
GPU_RESOURCE = "nvidia.com/gpu"
LAUNCHER_CONTAINER = "launcher"
WORKER_CONTAINER = "worker"
# Kubeflow profile namespaces inject Istio sidecars; MPI's ssh between pods
# and the launcher's exit (the sidecar keeps the pod running) break with them.
# Istio reads this label (the annotation of the same name is deprecated, and the
# label wins over it); set labels.sidecar.istio.io/inject to override it.
ISTIO_INJECT = "sidecar.istio.io/inject"
DEFAULT_POD_LABELS = {ISTIO_INJECT: "false"}

PullPolicy = Literal["Always", "IfNotPresent", "Never"]
RestartPolicyName = Literal["Never", "OnFailure"]  # the operator accepts only these
CleanPodPolicy = Literal["None", "Running", "All"]
LauncherCreationPolicy = Literal["AtStartup", "WaitForWorkersReady"]
MPIImplementation = Literal["OpenMPI", "Intel", "MPICH"]
# Who runs the MPIJob: the operator itself, or Kueue's MultiKueue (which
# dispatches it to a worker cluster). Any other value: nothing ever runs it.
ManagedBy = Literal["kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue"]
TolerationOperator = Literal["Equal", "Exists"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
NcclDebug = Literal["VERSION", "WARN", "INFO", "TRACE"]


def allowed(literal: Any) -> tuple[str, ...]:
    """The values of a ``Literal`` type, for messages and manifest checks."""
    return get_args(literal)


@dataclass(frozen=True)
class Resources:
    """CPU and memory of one pod: both requested and limited (Guaranteed QoS,
    so a busy node evicts other pods before a training rank)."""

    cpu: str
    memory: str
    # More resources, requested and limited alike: RDMA devices
    # (``rdma/hca_shared_devices_a: 1``), hugepages (``hugepages-2Mi: 1Gi``).
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodResources:
    worker: Resources = Resources(cpu="2", memory="4Gi")
    # mpirun (or horovodrun's driver) and ssh only: small, and never a GPU
    # (unless runLauncherAsWorker: then it gets the worker's resources).
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
    operator: TolerationOperator = "Equal"
    value: str | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None


@dataclass(frozen=True)
class Scheduling:
    """Where workers may run on a heterogeneous cluster.

    ``gpu_product`` pins workers to one GPU model (the GPU Feature Discovery
    label ``nvidia.com/gpu.product``), ``priority_class_name`` lets a
    low-priority job take older or preemptible cards. ``tolerations`` default
    (for GPU jobs) to the common ``nvidia.com/gpu:NoSchedule`` taint and apply
    to the launcher too (on a tainted GPU-only pool it must land as well).
    """

    gpu_product: str | None = None
    gpu_product_label: str = "nvidia.com/gpu.product"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] | None = None
    priority_class_name: str | None = None


@dataclass(frozen=True)
class SchedulingPolicy:
    """Gang scheduling (only used when the operator runs with --gang-scheduling).

    ``min_available`` defaults to the pods that exist together: the workers
    when the launcher waits for them (``WaitForWorkersReady``), workers + 1
    otherwise; elastic jobs count ``elastic.minWorkers``.
    """

    min_available: int | None = None
    queue: str | None = None
    priority_class: str | None = None
    schedule_timeout_seconds: int | None = None
    min_resources: dict[str, str] | None = None


@dataclass(frozen=True)
class RunPolicy:
    # Running: delete the workers (and their GPUs) as soon as the job ends.
    clean_pod_policy: CleanPodPolicy = "Running"
    # Data-parallel failures are mostly deterministic (bug, OOM): fail fast and
    # show the reason; opt in to retries, which resume from checkpoints.
    backoff_limit: int = 0
    # The operator gives this to the launcher Job only (newLauncherJob): a day after the job ends
    # the launcher Job and its pod (and logs) go; the MPIJob, its Service, ConfigMap and Secret stay
    # (cleanPodPolicy decides the workers) until `hvdk8s delete` or kubectl deletes the MPIJob.
    ttl_seconds_after_finished: int | None = 86400
    active_deadline_seconds: int | None = None
    scheduling_policy: SchedulingPolicy | None = None
    # Created suspended: no pods until something (Kueue, a person) unsuspends it.
    suspend: bool | None = None
    managed_by: ManagedBy | None = None


@dataclass(frozen=True)
class RestartPolicy:
    # The operator's own defaults.
    launcher: RestartPolicyName = "OnFailure"
    worker: RestartPolicyName = "Never"


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
    """Horovod's tuning knobs; unset ones keep Horovod's defaults (benchmarks/reports/knobs measures them)."""

    fusion_threshold: int = 128 * 1024 * 1024  # Horovod's default tensor fusion buffer (bytes)
    cycle_time_ms: float | None = None  # HOROVOD_CYCLE_TIME; Horovod's default 1 ms
    cache_capacity: int | None = None  # HOROVOD_CACHE_CAPACITY; Horovod's default 1024, 0 turns the cache off
    autotune: bool = False  # HOROVOD_AUTOTUNE
    timeline: str | None = None  # Chrome-trace file written by rank 0 (put it on the shared volume)


@dataclass(frozen=True)
class OpenMpi:
    """Open MPI's settings for the launcher's ``mpirun`` (``-mca``); docs/benchmark-studies.md has their measured effects."""

    # Open MPI's allreduce reduces Horovod's CPU tensors; GPU tensors go through NCCL (Dockerfile.gpu).
    # recursive_doubling: each rank sends its whole buffer at once; with Open MPI's 64 KiB TCP eager
    # limit it was faster for two hosts on a slow link, with hvdk8s's 16 MiB limit no longer; slower on
    # fast links and with more ranks (it sends more than a ring).
    allreduce_algorithm: AllreduceAlgorithm = "auto"
    yield_when_idle: bool = True  # busy-polling ranks (Open MPI's default) trained at 0.3-0.6 of the rate here
    # Bytes a TCP message may carry without waiting for the receiver (Open MPI's default: 65536); 16 MiB
    # trained 1.15-1.46x faster across emulated 1 Gbit/s links, level at 10 Gbit/s.
    tcp_eager_limit: int = DEFAULT_TCP_EAGER_LIMIT
    mca: dict[str, str] = field(default_factory=dict)  # any other parameter, e.g. btl_tcp_if_include: eth0


@dataclass(frozen=True)
class Nccl:
    debug: NcclDebug = "WARN"


@dataclass(frozen=True)
class JobSpec:
    """One data-parallel training job: ``workers`` pods x ``slots_per_worker``
    ranks each (= GPUs per worker when ``gpu``), launched by one launcher pod
    (which runs ranks too with ``run_launcher_as_worker``)."""

    name: str
    image: str
    command: tuple[str, ...]
    namespace: str | None = None  # None: kubectl's / the context's namespace decides
    # Kueue LocalQueue: the MPIJob gets the queue-name label and Kueue admits it whole.
    queue: str | None = None
    labels: dict[str, str] = field(default_factory=dict)  # on the MPIJob and every pod
    annotations: dict[str, str] = field(default_factory=dict)  # on the MPIJob
    # On every pod (the Istio opt-out is a label: DEFAULT_POD_LABELS).
    pod_annotations: dict[str, str] = field(default_factory=dict)
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    scheduler_name: str | None = None  # every pod, e.g. volcano
    # Plain Kubernetes objects for the worker pods (checked by the API server's pod schema).
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: tuple[dict[str, Any], ...] = ()
    # RDMA/InfiniBand opt-ins for the workers: the node's network stack, and
    # added container capabilities (IPC_LOCK lets verbs pin memory).
    host_network: bool = False
    capabilities: tuple[str, ...] = ()
    image_pull_policy: PullPolicy = "IfNotPresent"
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
    # None: WaitForWorkersReady, or AtStartup for jobs created suspended or
    # queued (the operator then starts the launcher with the workers anyway).
    launcher_creation_policy: LauncherCreationPolicy | None = None
    run_launcher_as_worker: bool = False
    mpi_implementation: MPIImplementation = "OpenMPI"
    user: User | None = None
    ssh_auth_mount_path: str | None = None  # default: the user's ~/.ssh
    ssh_port: int = 2222  # sshd port baked into the image (the operator's convention)
    # How long the launcher waits for every worker's sshd before it gives up and names those that
    # never answered: generous, since GPU node scale-up plus a multi-GB image pull can take long.
    worker_wait_seconds: int = 3600
    elastic: Elastic | None = None
    metrics: Metrics = Metrics()
    horovod: Horovod = Horovod()
    open_mpi: OpenMpi = OpenMpi()
    nccl: Nccl = Nccl()

    @property
    def hosts(self) -> int:
        """Pods in the operator's hostfile: the workers, and the launcher when it runs ranks."""
        return self.workers + int(self.run_launcher_as_worker)

    @property
    def np(self) -> int:
        """Ranks at start: the operator's hostfile gives each host ``slotsPerWorker`` slots."""
        return self.hosts * self.slots_per_worker

    @property
    def home(self) -> str:
        return f"/home/{self.user.name}" if self.user else "/root"
