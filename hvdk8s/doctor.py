"""``hvdk8s doctor``: report the training stack and say what to fix.

The classic failure it explains is a Horovod compiled against another TensorFlow than the installed one,
which otherwise surfaces as an ``undefined symbol`` traceback from ``horovod/tensorflow/mpi_ops.py``.
Exit status: 0 when everything training needs is fine, 1 otherwise (each problem on its own line).
``python -m hvdk8s.doctor --horovod-matches`` (used by scripts/setup.sh) exits 0 iff Horovod is installed,
built for the installed TensorFlow, imports, and has both MPI and Gloo.

Gathering is kept at the edges (`gather`); the verdicts (`problems`, `horovod_matches`, `report`) are pure
functions of the gathered `Facts`. MPI, TensorFlow, Horovod and TF Serving's gRPC stubs are imported only in a
child interpreter (`probe`): a mismatched native library can crash the process instead of raising, and their
import chatter on stderr stays out of the report. TF Serving's API (``hvdk8s serve``, ``--grpc``) is reported
with its install command, but is no problem for training.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hvdk8s import __version__

DESCRIPTION = ("Report Python, TensorFlow, Keras, hvdk8s, Horovod (and the TensorFlow it was built for), Open MPI, "
               "TF Serving's API and the GPUs, and explain each problem with what to do. "
               "Exit status: 0 ready to train, 1 problems found.")
PROBE_TIMEOUT_S = 300  # a cold TensorFlow import on a slow disk takes a minute or more
_MARK = "hvdk8s-doctor-probe "  # prefixes the child's result lines, so stray stdout from imports is ignored


@dataclass
class TensorFlowFacts:
    version: str | None = None  # tf.__version__; None when TensorFlow does not import
    error: str | None = None  # why it does not import
    cuda_build: bool = False
    cuda_version: str | None = None
    cudnn_version: str | None = None
    gpus: list[str] = field(default_factory=list)  # the GPUs TensorFlow sees


@dataclass
class HorovodFacts:
    path: str | None = None  # the horovod package directory; None when not installed
    version: str | None = None  # the installed distribution's version
    built_for: str | None = None  # the TensorFlow version in its metadata.json, written by Horovod's build
    error: str | None = None  # why horovod.tensorflow does not import
    mpi: bool = False
    gloo: bool = False
    nccl: bool = False


@dataclass
class MpiFacts:
    mpirun: str | None = None  # its path; None when not on PATH
    mpirun_version: str | None = None
    mpi4py: str | None = None  # the installed mpi4py version
    mpi4py_library: str | None = None  # the MPI library mpi4py was built against (first line)
    mpi4py_error: str | None = None


@dataclass
class ServingApiFacts:
    path: str | None = None  # the tensorflow_serving package directory; None when not installed
    version: str | None = None  # the installed tensorflow-serving-api distribution's version
    error: str | None = None  # why its gRPC stubs do not import


@dataclass
class NvmlFacts:
    driver: str | None = None
    gpus: list[str] = field(default_factory=list)
    error: str | None = None  # why NVML is unavailable (no nvidia-ml-py, no driver: a CPU machine)


@dataclass
class Facts:
    python: str = platform.python_version()
    executable: str = sys.executable
    hvdk8s: str = __version__
    keras: str | None = None
    tensorflow: TensorFlowFacts = field(default_factory=TensorFlowFacts)
    horovod: HorovodFacts = field(default_factory=HorovodFacts)
    mpi: MpiFacts = field(default_factory=MpiFacts)
    serving_api: ServingApiFacts = field(default_factory=ServingApiFacts)
    nvml: NvmlFacts = field(default_factory=NvmlFacts)


# ---- verdicts (pure) ----


def problems(facts: Facts) -> list[str]:
    """What stands between this environment and training, each with what to do."""
    tf, hvd = facts.tensorflow, facts.horovod
    rebuild = f"PYTHON={facts.executable} bash scripts/install-horovod.sh"
    if tf.version is None:
        # Without TensorFlow nothing about Horovod's build can be judged (it cannot import either).
        found = [f"TensorFlow does not import ({tf.error}): install it with `bash scripts/setup.sh`, "
                 "or `pip install -e '.[cpu]'` ('.[gpu]' for CUDA) in the hvdk8s checkout"]
        if hvd.path is None:
            found.append(f"Horovod is not installed: once TensorFlow is, build it with `{rebuild}`")
        return found
    name = _horovod_name(hvd)
    if hvd.path is None:
        return [f"Horovod is not installed: build it for TensorFlow {tf.version} with `{rebuild}`"]
    if hvd.built_for is None:
        return [f"{name} has no metadata.json, so the TensorFlow it was built for is unknown: "
                f"rebuild it with `{rebuild}`"]
    if hvd.built_for != tf.version:
        return [f"{name} was built against TensorFlow {hvd.built_for} but TensorFlow {tf.version} is installed: "
                f"rebuild it with `{rebuild}`"]
    if hvd.error is not None:
        return [f"Horovod's TensorFlow library does not load: {hvd.error}: rebuild it with `{rebuild}`"]
    if not (hvd.mpi or hvd.gloo):
        return [f"{name} was built without MPI and without Gloo, so it cannot start ranks: rebuild it with `{rebuild}`"]
    if facts.mpi.mpirun is None:
        return ["mpirun is not on PATH: `hvdk8s run` starts its ranks with Open MPI's mpirun "
                "(Debian: apt-get install openmpi-bin; `bash scripts/setup.sh` installs it)"]
    return []


def horovod_matches(facts: Facts) -> bool:
    """scripts/setup.sh's last check: nothing to fix, and both controllers built."""
    return not problems(facts) and facts.horovod.mpi and facts.horovod.gloo


def serving_api_install(python: str, tensorflow: str) -> str:
    """The command that installs TF Serving's gRPC stubs for TensorFlow `tensorflow` as scripts/setup.sh does
    (its stacks pin tensorflow-serving-api to TensorFlow's x.y), and why ``--no-deps``."""
    minor = ".".join(tensorflow.split(".")[:2])
    return (f"`{python} -m pip install --no-deps 'tensorflow-serving-api=={minor}.*'` (--no-deps: it requires "
            "the full `tensorflow` package, which would land next to tensorflow-cpu; its real needs, grpcio and "
            "protobuf, are already installed)")


def report(facts: Facts) -> list[str]:
    """The human-readable report: one line per item, then the problems (or that all is well)."""
    tf, hvd, mpi, serving, nvml = facts.tensorflow, facts.horovod, facts.mpi, facts.serving_api, facts.nvml
    if tf.version is None:
        tensorflow = f"does not import: {tf.error}"
    elif tf.cuda_build:
        tensorflow = f"{tf.version}, CUDA build (CUDA {tf.cuda_version}, cuDNN {tf.cudnn_version})"
    else:
        tensorflow = f"{tf.version}, CPU-only build"
    if hvd.path is None:
        horovod, horovod_build = "not installed", "-"
    else:
        if hvd.built_for is None:
            built_for = "built for an unknown TensorFlow (no metadata.json)"
        elif tf.version is None:
            built_for = f"built for TensorFlow {hvd.built_for}"
        elif hvd.built_for == tf.version:
            built_for = f"built for TensorFlow {hvd.built_for}: matches"
        else:
            built_for = f"built for TensorFlow {hvd.built_for}, not the installed {tf.version}"
        horovod = f"{hvd.version or 'version unknown'} ({hvd.path}), {built_for}"
        horovod_build = (f"does not import: {hvd.error}" if hvd.error is not None else
                         f"MPI {_yes(hvd.mpi)}, Gloo {_yes(hvd.gloo)}, NCCL {_yes(hvd.nccl)}")
    if mpi.mpirun is None:
        mpirun = "not found on PATH: `hvdk8s run` needs Open MPI (Debian: apt-get install openmpi-bin)"
    else:
        mpirun = f"{mpi.mpirun_version} ({mpi.mpirun})"
    mpi4py = (f"{mpi.mpi4py} on {mpi.mpi4py_library}" if mpi.mpi4py_library is not None else
              f"unavailable: {mpi.mpi4py_error}")
    if serving.path is None:
        serving_api = "not installed: `hvdk8s serve` and --grpc need it" + (
            f"; install it with {serving_api_install(facts.executable, tf.version)}" if tf.version else "")
    else:
        serving_api = f"{serving.version or 'version unknown'} ({serving.path})" + (
            f", does not import: {serving.error}" if serving.error is not None else "")
    nvidia = (f"driver {nvml.driver}: {', '.join(nvml.gpus) or 'no GPUs'}" if nvml.driver is not None else
              f"no NVML ({nvml.error})")
    lines = [
        _line("Python", f"{facts.python} ({facts.executable})"),
        _line("TensorFlow", tensorflow),
        _line("Keras", facts.keras or "not installed"),
        _line("hvdk8s", facts.hvdk8s),
        _line("Horovod", horovod),
        _line("Horovod ops", horovod_build),
        _line("mpirun", mpirun),
        _line("mpi4py", mpi4py),
        _line("TF Serving", serving_api),
        _line("GPUs", ", ".join(tf.gpus) or "none"),
        _line("NVIDIA", nvidia),
        "",
    ]
    found = problems(facts)
    return lines + ([f"problem: {p}" for p in found] or ["ok: ready to train"])


def _line(label: str, value: str) -> str:
    return f"{label:<12} {value}"


def _yes(built: bool) -> str:
    return "yes" if built else "no"


def _horovod_name(hvd: HorovodFacts) -> str:
    return f"Horovod {hvd.version}" if hvd.version else "Horovod"


# ---- gathering (imports, files, subprocesses) ----


def gather() -> Facts:
    """Collect the facts about this interpreter's environment."""
    stages = _run_probe()
    hvd_path = _package_path("horovod")
    mpirun = shutil.which("mpirun")
    return Facts(
        keras=_dist_version("keras"),
        tensorflow=TensorFlowFacts(**stages["tensorflow"]),
        horovod=HorovodFacts(path=hvd_path, version=_dist_version("horovod"),
                             built_for=_horovod_built_for(hvd_path), **stages["horovod"]),
        mpi=MpiFacts(mpirun=mpirun, mpirun_version=_mpirun_version(mpirun) if mpirun else None,
                     mpi4py=_dist_version("mpi4py"), mpi4py_library=stages["mpi4py"].get("library"),
                     mpi4py_error=stages["mpi4py"].get("error")),
        serving_api=ServingApiFacts(path=_package_path("tensorflow_serving"),
                                    version=_dist_version("tensorflow-serving-api"), **stages["serving_api"]),
        nvml=_nvml(),
    )


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_path(name: str) -> str | None:
    """Where ``import NAME`` would come from, found without importing it (Horovod's import loads TensorFlow)."""
    spec = importlib.util.find_spec(name)
    return None if spec is None or not spec.submodule_search_locations else spec.submodule_search_locations[0]


def _horovod_built_for(path: str | None) -> str | None:
    """The TensorFlow version Horovod's build recorded (what horovod.common.util.check_installed_version reads)."""
    if path is None:
        return None
    try:
        return json.loads((Path(path) / "metadata.json").read_text()).get("tensorflow")
    except (OSError, ValueError):
        return None


def _mpirun_version(mpirun: str) -> str:
    try:
        proc = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"`mpirun --version` failed: {_first_line(err)}"
    return (proc.stdout.strip().splitlines() or [f"`mpirun --version` printed nothing (exit {proc.returncode})"])[0]


def _nvml() -> NvmlFacts:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # no nvidia-ml-py, no NVIDIA driver: reported, not a problem (CPU training)
        return NvmlFacts(error=_first_line(err))
    try:
        gpus = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]
        return NvmlFacts(driver=pynvml.nvmlSystemGetDriverVersion(), gpus=gpus)
    finally:
        pynvml.nvmlShutdown()


def _run_probe() -> dict[str, dict[str, Any]]:
    """Run `probe` in a child interpreter; a stage it did not report (a crash, a hang) gets an error."""
    # -P: the working directory must not shadow packages (run from horovod/, its tensorflow/ would).
    cmd = [sys.executable, "-P", "-c", "from hvdk8s.doctor import probe; probe()"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stdout, failure = "", f"the import did not finish in {PROBE_TIMEOUT_S} s"
    else:
        stdout = proc.stdout
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        failure = f"the import ended the interpreter ({how}): {last}"
    stages: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if line.startswith(_MARK):
            stages.update(json.loads(line[len(_MARK):]))
    return {name: stages.get(name, {"error": failure}) for name in _PROBE_STAGES}


def probe() -> None:
    """The child's side of `_run_probe`: one marked JSON line per stage, flushed before the next import,
    so the stages that finished survive a crash in a later one."""
    for name, stage in _PROBE_STAGES.items():
        try:
            result = stage()
        except Exception as err:  # a broken install is what is being diagnosed
            result = {"error": _first_line(err)}
        print(_MARK + json.dumps({name: result}), flush=True)


def _probe_mpi4py() -> dict[str, Any]:
    import mpi4py

    mpi4py.rc.initialize = False  # only the library's version is wanted: no MPI_Init
    from mpi4py import MPI

    return {"library": MPI.Get_library_version().strip("\0 \n").splitlines()[0]}


def _probe_tensorflow() -> dict[str, Any]:
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    gpus = [tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)
            for gpu in tf.config.list_physical_devices("GPU")]
    return {"version": tf.__version__, "cuda_build": tf.test.is_built_with_cuda(),
            "cuda_version": _str_or_none(info.get("cuda_version")),
            "cudnn_version": _str_or_none(info.get("cudnn_version")), "gpus": gpus}


def _probe_horovod() -> dict[str, Any]:
    import horovod.tensorflow as hvd

    return {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built()), "nccl": bool(hvd.nccl_built())}


def _probe_serving_api() -> dict[str, Any]:
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc  # noqa: F401

    return {}


_PROBE_STAGES: dict[str, Callable[[], dict[str, Any]]] = {
    "mpi4py": _probe_mpi4py,
    "tensorflow": _probe_tensorflow,
    "horovod": _probe_horovod,
    "serving_api": _probe_serving_api,
}


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _first_line(err: BaseException) -> str:
    message = str(err).strip().splitlines()
    return f"{type(err).__name__}: {message[0]}" if message else type(err).__name__


# ---- command line ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's flags, shared by ``hvdk8s doctor`` and ``python -m hvdk8s.doctor``."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print the facts and problems as JSON")
    mode.add_argument("--horovod-matches", action="store_true",
                      help="print nothing; exit 0 iff Horovod is installed, built for the installed TensorFlow, "
                           "imports, and has MPI and Gloo (scripts/setup.sh's last check)")
    parser.set_defaults(handler=run)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "doctor", help="report the training stack (TensorFlow, Keras, Horovod, MPI, GPUs) and what to fix",
        description=DESCRIPTION,
    )
    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    facts = gather()
    if args.horovod_matches:
        return 0 if horovod_matches(facts) else 1
    found = problems(facts)
    if args.json:
        print(json.dumps({**asdict(facts), "problems": found, "horovod_matches": horovod_matches(facts)}, indent=2))
    else:
        print("\n".join(report(facts)))
    return 1 if found else 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m hvdk8s.doctor", description=DESCRIPTION)
    add_arguments(_parser)
    _args = _parser.parse_args()
    sys.exit(_args.handler(_args))
