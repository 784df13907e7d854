"""What one benchmark run measures, and the presets that size it.

Every knob lives in one frozen dataclass that is written verbatim into the
results, so a report always says how it was produced (rerun its recorded
command on the same commit to reproduce it). Pure data: nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvdk8s.common.fields import FieldError, SpecError, at_least, invalid, join
from hvdk8s.launcher.mpirun import MIN_TCP_EAGER_LIMIT, transport_mca

from ..emulation.netns import parse_rate
from . import synthetic
from .knobs import names as knob_names

STRATEGIES = (
    "single", "hvdk8s", "horovod", "tf_mwms", "tf_ps", "hvdk8s_fp16", "hvdk8s_rd", "hvdk8s_eager64k", "hvdk8s_spe",
    "horovod_tfdefault", "horovod_split",
)
STRATEGY_LABELS = {
    "single": "single process (Keras fit)",
    "hvdk8s": "hvdk8s (Keras fit on Horovod)",
    "horovod": "raw horovod.tensorflow loop",
    "tf_mwms": "TF MultiWorkerMirrored (RING)",
    "tf_ps": "TF ParameterServer (async)",
    "hvdk8s_fp16": "hvdk8s, fp16 gradient compression (lower precision: its own row)",
    "hvdk8s_rd": "hvdk8s, Open MPI recursive-doubling allreduce (openMpi.allreduceAlgorithm)",
    "hvdk8s_eager64k": "hvdk8s, Open MPI's own 64 KiB TCP eager limit (openMpi.tcpEagerLimit: 65536)",
    "hvdk8s_spe": "hvdk8s, Keras steps_per_execution=5 (batch callbacks every 5 steps: its own row)",
    "horovod_tfdefault": "raw horovod.tensorflow loop at TensorFlow's default thread pools (what a user gets)",
    "horovod_split": "raw horovod.tensorflow loop at hvdk8s's CPU thread split (cores / local_size intra-op threads)",
}
# Strategies launched by mpirun; the TF ones are TF_CONFIG clusters.
# The raw loop at the thread pools a user gets by default, and at hvdk8s's split (hvdk8s.threads): the suite sets no
# thread count for them, so their ratio is the thread policy's own gain; at N=1 the split is TensorFlow's default.
THREAD_STRATEGIES = ("horovod_tfdefault", "horovod_split")
# The raw horovod.tensorflow loop, whatever its threads
RAW_LOOP_STRATEGIES = ("horovod", *THREAD_STRATEGIES)
HOROVOD_STRATEGIES = ("hvdk8s", *RAW_LOOP_STRATEGIES, "hvdk8s_fp16", "hvdk8s_rd", "hvdk8s_eager64k", "hvdk8s_spe")
# hvdk8s under Keras fit, and the variants that differ from it only in settings
HVDK8S_STRATEGIES = ("hvdk8s", "hvdk8s_fp16", "hvdk8s_rd", "hvdk8s_eager64k", "hvdk8s_spe")
# Keras compile(steps_per_execution=K): K steps per compiled call, so windows and warm-up are multiples of K.
STEPS_PER_EXECUTION = {"hvdk8s_spe": 5}
# Launches that also time the raw loop in alternating windows on the same ranks.
PAIRED_STRATEGIES = ("hvdk8s", "hvdk8s_spe")
# No time-to-accuracy run: Keras 3.8 runs a whole K-step call at the end of an epoch whose
# length is not a multiple of K, so its epochs would not be the others' epochs.
NO_TTA = ("hvdk8s_spe", *THREAD_STRATEGIES)
# Open MPI parameters of a strategy's launches (over the knob's): the job spec's transport settings.
STRATEGY_MCA = {
    "hvdk8s_rd": transport_mca("recursive_doubling"),
    "hvdk8s_eager64k": transport_mca(tcp_eager_limit=MIN_TCP_EAGER_LIMIT),
}
ONE_PROCESS_ONLY = ("single",)
# One rank does no allreduce: nothing to compress, no algorithm or transport to choose; and its thread split is
# TensorFlow's default pool.
MANY_PROCESSES_ONLY = ("hvdk8s_fp16", "hvdk8s_rd", "hvdk8s_eager64k", *THREAD_STRATEGIES)
# Main training section's default: the rest are measured where they matter, on emulated links.
DEFAULT_STRATEGIES = ("single", "hvdk8s", "horovod", "tf_mwms", "tf_ps", "hvdk8s_fp16", "hvdk8s_spe", *THREAD_STRATEGIES)
# --quick: the four strategies people choose between, and the thread policy's own row
QUICK_STRATEGIES = ("hvdk8s", "horovod", "tf_mwms", "tf_ps", *THREAD_STRATEGIES)
WORKLOADS = ("cnn", "mlp")


@dataclass(frozen=True)
class Workload:
    """A model and the per-rank batch every strategy trains it with."""

    name: str
    batch_per_rank: int
    mlp_width: int = 0  # only for "mlp": input and hidden width

    def describe(self) -> str:
        if model := synthetic.model_of(self.name):
            return f"keras.applications.{model} on 224x224x3 images, 1000 classes (Horovod's synthetic benchmark model)"
        if self.name == "cnn":
            return "hvdk8s.models.cnn on 28x28x1 images (compute-bound)"
        return f"MLP {self.mlp_width}-{self.mlp_width}-{self.mlp_width}-10, VGG-head-like (communication-heavy)"


@dataclass(frozen=True)
class Settings:
    """All knobs of one run; ``preset`` names where the defaults came from."""

    preset: str
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    workloads: tuple[str, ...] = WORKLOADS
    ranks: tuple[int, ...] = (1, 2)
    threads_per_rank: int = 1
    cnn_batch: int = 32
    mlp_batch: int = 8
    mlp_width: int = 2048
    warmup_steps: int = 5
    steps: int = 20  # per timed window (per worker for tf_ps: N x steps in all)
    windows: int = 3  # timed windows per model
    models: int = 1  # models built one after another per launch, their windows pooled
    rounds: int = 1  # launches per configuration, interleaved across strategies
    # time to accuracy on the real digits data
    tta: bool = True
    tta_target: float = 0.95
    tta_max_epochs: int = 10
    tta_batch: int = 32
    tta_lr: float = 0.02
    # allreduce microbenchmark (bytes)
    allreduce_ranks: int = 2
    allreduce_sizes: tuple[int, ...] = tuple(4 ** k * 1024 for k in range(0, 9))  # 1 KiB .. 64 MiB
    allreduce_min_seconds: float = 0.2
    allreduce_repeats: int = 3
    fusion_tensors: int = 64
    fusion_tensor_bytes: tuple[int, ...] = (4096, 65536)
    memcopy_bytes: int = 64 * 1024 * 1024
    # emulated cluster in network namespaces ("" rates: skip the section)
    emulated_rates: tuple[str, ...] = ("1gbit", "10gbit")
    emulated_workers: tuple[int, ...] = (2, 4)
    emulated_sizes: tuple[int, ...] = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
    emulated_comm_steps: int = 3
    emulated_train_rates: tuple[str, ...] = ("1gbit", "10gbit")  # each must be one of emulated_rates
    emulated_train_strategies: tuple[str, ...] = (
        "hvdk8s", "tf_mwms", "tf_ps", "hvdk8s_fp16", "hvdk8s_rd", "hvdk8s_eager64k"
    )
    emulated_train_workers: int = 2
    emulated_train_steps: int = 10  # per window; warm-up and windows as in the main training section
    # per-phase breakdown of one N=2 step (hvdk8s and the raw loop) and a Horovod timeline of it
    profile: bool = False
    profile_steps: int = 20
    profile_workloads: tuple[str, ...] = ()  # the workloads the profile breaks down, among workloads (empty: all of them)
    # Horovod's synthetic benchmarks (``--workloads horovod-synthetic:<Model>``, see ``synthetic``): launches of each
    # script per model and N, raw loop and hvdk8s alternating which goes first
    synthetic_rounds: int = 3
    synthetic_batches_per_iter: int = 10
    synthetic_iters: int = 3
    # a folder with Horovod's own two synthetic scripts (its examples/tensorflow2): each round launches them too, and
    # the report says whether the suite's versions agree with them ("": not run)
    synthetic_peer: str = ""
    # Horovod, Open MPI and stack knobs (``knobs``), each measured against the defaults in the same round
    knobs: tuple[str, ...] = ()
    knob_rounds: int = 2
    # process limits
    launch_timeout_s: float = 600.0

    @property
    def suite_workloads(self) -> tuple[str, ...]:
        """The workloads the suite's own worker trains (not Horovod's synthetic scripts)."""
        return tuple(w for w in self.workloads if synthetic.model_of(w) is None)

    @property
    def profiled_workloads(self) -> tuple[str, ...]:
        """The workloads the profile breaks down: ``profile_workloads``, or every workload where none is named."""
        return self.profile_workloads or self.workloads

    @property
    def synthetic_models(self) -> tuple[str, ...]:
        """keras.applications models of the ``horovod-synthetic:<Model>`` workloads."""
        return tuple(m for w in self.workloads if (m := synthetic.model_of(w)))

    def workload(self, name: str) -> Workload:
        if name == "cnn":
            return Workload("cnn", self.cnn_batch)
        if name == "mlp":
            return Workload("mlp", self.mlp_batch, self.mlp_width)
        if model := synthetic.model_of(name):  # the suite's own harnesses (the profile) on Horovod's benchmark model
            return Workload(name, synthetic.batch(model))
        raise ValueError(f"workload {name!r}: expected one of {WORKLOADS}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Settings":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"settings: unknown field(s) {unknown}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)


PRESETS: dict[str, Settings] = {
    # The strategy comparison, what to run first: the four strategies and the thread policy's row at N=1,2, one
    # launch each (the spread shown is the launch's windows; --brief and --full repeat launches for reports), one
    # model per launch; no emulated links, no fp16/steps_per_execution rows (13 jobs; see docs/benchmarks.md).
    "quick": Settings(preset="quick", strategies=QUICK_STRATEGIES, rounds=1, models=1, windows=3, emulated_rates=()),
    # The headline only: hvdk8s with the raw loop's windows alternating in the same launches, N=1 and N=2, three
    # rounds, the thread policy's row at N=2, and the allreduce microbenchmark; no time to accuracy, no emulated links
    # (15 jobs, about ten minutes).
    "brief": Settings(preset="brief", strategies=("hvdk8s", *THREAD_STRATEGIES), rounds=3, models=2, windows=2, tta=False, emulated_rates=(),
                      allreduce_sizes=tuple(4 ** k * 1024 for k in range(0, 8, 2)), allreduce_repeats=2),
    # Longer windows, three interleaved launches per configuration, bigger
    # messages and the 4096-wide MLP (134 MB of fp32 gradients).
    "full": Settings(
        preset="full",
        mlp_width=4096,
        warmup_steps=10,
        steps=50,
        windows=3,
        models=2,
        rounds=3,
        tta_max_epochs=20,
        allreduce_sizes=tuple(4 ** k * 1024 for k in range(0, 10)) + (512 << 20,),
        allreduce_min_seconds=0.5,
        allreduce_repeats=5,
        fusion_tensor_bytes=(1024, 4096, 65536, 262144),
        memcopy_bytes=256 * 1024 * 1024,
        emulated_sizes=(4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20),
        emulated_comm_steps=5,
        emulated_train_steps=20,
        launch_timeout_s=1200.0,
    ),
}


def preset(name: str, **overrides: Any) -> Settings:
    """A preset with ``overrides`` applied (None values are ignored); ``SettingsError`` lists every bad field."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"preset {name!r}: expected one of {sorted(PRESETS)}") from None
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = dataclasses.replace(base, **given)
    if errors := validate(settings):
        raise SettingsError(settings, errors)
    return settings


class SettingsError(SpecError, ValueError):
    """Settings no run can use, every problem under its field's name; ``settings`` are the settings as given, for
    a caller whose users name the fields otherwise (``validate(err.settings, spell=...)``, e.g. as flags).

    Also a ``ValueError``, which its callers caught before the errors were collected.
    """

    def __init__(self, settings: Settings, field_errors: list[FieldError]):
        super().__init__("settings", field_errors)
        self.settings = settings


# Counts with a lower bound: field -> (least value, why, or "")
_LEAST: dict[str, tuple[int, str]] = {
    "warmup_steps": (1, "the first step traces the model and is never timed"),
    **{name: (1, "") for name in ("steps", "windows", "models", "rounds", "threads_per_rank", "allreduce_repeats",
                                  "tta_max_epochs", "profile_steps", "knob_rounds", "emulated_train_steps",
                                  "synthetic_rounds", "synthetic_iters", "emulated_train_workers")},
    "synthetic_batches_per_iter": (2, "the raw loop's first step and at least one warm-up batch make its warm-up "
                                      "iteration"),
    "allreduce_ranks": (2, "busbw needs at least 2 ranks"),
    **{name: (1, "") for name in ("mlp_width", "cnn_batch", "mlp_batch", "tta_batch", "fusion_tensors",
                                  "emulated_comm_steps")},
    "memcopy_bytes": (8, "the copy moves whole float64s"),
}
# Message sizes in bytes: each allreduce sends size // 4 float32s, so at least one
_SIZES = ("allreduce_sizes", "fusion_tensor_bytes", "emulated_sizes")
MIN_MESSAGE_BYTES = 4


def validate(s: Settings, path: str = "", spell: Callable[[str], str] = str) -> list[FieldError]:
    """Every problem that would make a run meaningless or unfinishable, each at ``path`` plus the field as ``spell``
    writes it (the field's name by default; a command line's flag). Other fields a problem refers to are written
    the same way."""
    def at(name: str) -> str:
        return join(path, spell(name))

    errors: list[FieldError] = []
    if bad := [x for x in s.strategies if x not in STRATEGIES]:
        errors.append(FieldError("NotSupported", at("strategies"),
                                 f"unknown {bad}; expected some of {', '.join(STRATEGIES)}"))
    if bad := [x for x in s.workloads if x not in WORKLOADS and not x.startswith(synthetic.PREFIX)]:
        errors.append(FieldError("NotSupported", at("workloads"),
                                 f"unknown {bad}; expected some of {', '.join(WORKLOADS)} or {synthetic.PREFIX}<Model>"))
    for w in s.workloads:
        try:
            synthetic.model_of(w)  # a malformed model name fails here
        except ValueError as err:
            errors.append(invalid(at("workloads"), str(err)))
    if bad := [x for x in s.profile_workloads if x not in s.workloads]:
        errors.append(invalid(at("profile_workloads"), f"{bad} not among {at('workloads')} {list(s.workloads)}"))
    if not s.ranks or min(s.ranks) < 1 or 1 not in s.ranks:
        errors.append(invalid(at("ranks"), f"{list(s.ranks)} must include 1 (the baseline of E(N)) and be >= 1"))
    for name, (least, why) in _LEAST.items():
        errors += [invalid(e.path, f"{e.detail} ({why})" if why else e.detail)
                   for e in at_least(at(name), getattr(s, name), least)]
    for name in _SIZES:
        if bad := [n for n in getattr(s, name) if not isinstance(n, int) or isinstance(n, bool) or n < MIN_MESSAGE_BYTES]:
            errors.append(invalid(at(name), f"{bad}: each size must be >= {MIN_MESSAGE_BYTES} bytes (one float32)"))
    for name, low, closed in (("launch_timeout_s", 0, False), ("tta_lr", 0, False), ("allreduce_min_seconds", 0, True)):
        value = getattr(s, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (value >= low if closed else value > low):
            errors.append(invalid(at(name), f"must be {'>=' if closed else '>'} {low}, got {value!r}"))
    if s.synthetic_peer and not any(w.startswith(synthetic.PREFIX) for w in s.workloads):  # a bad one: reported above
        errors.append(invalid(at("synthetic_peer"), f"{s.synthetic_peer!r}: no {synthetic.PREFIX}<Model> workload in "
                              f"{at('workloads')} to compare Horovod's scripts with"))
    if not 0 < s.tta_target <= 1:
        errors.append(invalid(at("tta_target"), f"{s.tta_target} must be in (0, 1]"))
    if any(n < 2 for n in s.emulated_workers):
        errors.append(invalid(at("emulated_workers"), f"{list(s.emulated_workers)}: the cluster needs at least 2 workers"))
    emulated = tuple(x for x in STRATEGIES if x != "single" and x not in THREAD_STRATEGIES)
    if bad := [x for x in s.emulated_train_strategies if x not in emulated]:
        errors.append(FieldError("NotSupported", at("emulated_train_strategies"),
                                 f"unsupported {bad}; expected some of {', '.join(emulated)}"))
    many = [x for x in s.emulated_train_strategies if x in MANY_PROCESSES_ONLY and x in emulated]
    if s.emulated_train_workers < 2 and many:
        errors.append(invalid(at("emulated_train_strategies"), f"{many} need {at('emulated_train_workers')} >= 2"))
    for strategy, k in STEPS_PER_EXECUTION.items():
        counts = {"warmup_steps": s.warmup_steps, "steps": s.steps}
        if strategy in s.emulated_train_strategies:
            counts["emulated_train_steps"] = s.emulated_train_steps
        if strategy in s.strategies + s.emulated_train_strategies:
            errors += [invalid(at(name), f"{n} is not a multiple of {k}: {strategy} runs {k} steps per compiled call")
                       for name, n in counts.items() if n >= 1 and n % k]  # below 1: reported above
    for rate in s.emulated_rates:
        try:
            parse_rate(rate)  # a typo fails here, not after minutes of training
        except ValueError as err:
            errors.append(invalid(at("emulated_rates"), str(err)))
    if s.emulated_train_strategies and s.emulated_rates:
        if missing := [r for r in s.emulated_train_rates if r not in s.emulated_rates]:
            errors.append(invalid(at("emulated_train_rates"),
                                  f"{missing} not among {at('emulated_rates')} {list(s.emulated_rates)}"))
    if bad := [k for k in s.knobs if k not in knob_names()]:
        errors.append(FieldError("NotSupported", at("knobs"), f"unknown {bad}; expected some of {', '.join(knob_names())}"))
    return errors
