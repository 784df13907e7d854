"""``hvdk8s doctor``: the real environment, fake Horovod installs (mismatched, broken, crashing) found first on
PYTHONPATH, and the verdicts on hand-made facts."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdk8s.doctor import (
    Facts,
    HorovodFacts,
    MpiFacts,
    ServingApiFacts,
    TensorFlowFacts,
    horovod_matches,
    problems,
    report,
)

REPO = Path(__file__).resolve().parents[1]
HVDK8S = str(Path(sys.executable).parent / "hvdk8s")


def doctor(*cmd: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed_tensorflow() -> str:
    import tensorflow as tf

    return tf.__version__


def fake_horovod(tmp_path: Path) -> Path:
    """A copy of the installed horovod package in tmp_path (put first on PYTHONPATH), to break at will."""
    spec = importlib.util.find_spec("horovod")
    assert spec is not None and spec.submodule_search_locations, "these tests need Horovod installed"
    copy = tmp_path / "horovod"
    shutil.copytree(spec.submodule_search_locations[0], copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def serving_api() -> dict[str, str]:
    """The installed tensorflow-serving-api: its version and the tensorflow_serving package directory."""
    spec = importlib.util.find_spec("tensorflow_serving")
    assert spec is not None and spec.submodule_search_locations, "these tests need tensorflow-serving-api installed"
    return {"path": spec.submodule_search_locations[0], "version": importlib.metadata.version("tensorflow-serving-api")}


# ---- the real environment ----


def test_report_on_this_environment(installed_tensorflow: str) -> None:
    proc = doctor(HVDK8S, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith(f"TensorFlow   {installed_tensorflow}, ") for line in lines)
    assert any(line.startswith("Horovod ") and f"built for TensorFlow {installed_tensorflow}: matches" in line
               for line in lines)
    assert any(line.startswith("Horovod ops  MPI yes, Gloo yes, NCCL ") for line in lines)
    assert f"TF Serving   {serving_api()['version']} ({serving_api()['path']})" in lines
    assert lines[-1] == "ok: ready to train"


def test_json_on_this_environment(installed_tensorflow: str) -> None:
    proc = doctor(sys.executable, "-m", "hvdk8s.cli", "doctor", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["tensorflow"]["version"] == installed_tensorflow
    assert facts["horovod"]["built_for"] == installed_tensorflow
    assert (facts["horovod"]["mpi"], facts["horovod"]["gloo"]) == (True, True)
    assert facts["mpi"]["mpirun"] == shutil.which("mpirun")
    assert facts["serving_api"] == {**serving_api(), "error": None}
    assert (facts["problems"], facts["horovod_matches"]) == ([], True)


def test_horovod_matches_on_this_environment() -> None:
    proc = doctor(sys.executable, "-m", "hvdk8s.doctor", "--horovod-matches")
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stderr


# ---- fake Horovod installs ----


def test_horovod_built_for_another_tensorflow(tmp_path: Path, installed_tensorflow: str) -> None:
    metadata = fake_horovod(tmp_path) / "metadata.json"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "tensorflow": "2.18.1"}))
    proc = doctor(HVDK8S, "doctor", pythonpath=tmp_path)
    assert proc.returncode == 1
    horovod = importlib.metadata.version("horovod")
    problem = (f"problem: Horovod {horovod} was built against TensorFlow 2.18.1 "
               f"but TensorFlow {installed_tensorflow} is installed")
    assert problem in proc.stdout
    assert "bash scripts/install-horovod.sh" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert doctor(sys.executable, "-m", "hvdk8s.doctor", "--horovod-matches", pythonpath=tmp_path).returncode == 1


def test_horovod_library_that_does_not_load(tmp_path: Path) -> None:
    (library,) = (fake_horovod(tmp_path) / "tensorflow").glob("mpi_lib*.so")
    library.write_bytes(b"")
    proc = doctor(HVDK8S, "doctor", pythonpath=tmp_path)
    assert proc.returncode == 1
    assert f"problem: Horovod's TensorFlow library does not load: NotFoundError: {library}: file too short: " \
           "rebuild it with `PYTHON=" in proc.stdout
    assert "bash scripts/install-horovod.sh" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_horovod_import_that_crashes_the_interpreter(tmp_path: Path, installed_tensorflow: str) -> None:
    init = fake_horovod(tmp_path) / "tensorflow" / "__init__.py"
    init.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n" + init.read_text())
    proc = doctor(sys.executable, "-m", "hvdk8s.cli", "doctor", "--json", pythonpath=tmp_path)
    assert proc.returncode == 1
    facts = json.loads(proc.stdout)
    assert facts["tensorflow"]["version"] == installed_tensorflow  # stages before the crash survive it
    assert facts["horovod"]["error"].startswith("the import ended the interpreter (signal 11)")
    assert facts["problems"][0].startswith("Horovod's TensorFlow library does not load: the import ended")


# ---- verdicts on hand-made facts ----


def facts(tensorflow: str | None = "2.21.0", **horovod: object) -> Facts:
    """A healthy environment unless told otherwise; `horovod` overrides HorovodFacts fields."""
    hvd = {"path": "/venv/site-packages/horovod", "version": "0.28.1", "built_for": "2.21.0", "mpi": True,
           "gloo": True, **horovod}
    tf = TensorFlowFacts(version=tensorflow,
                         error=None if tensorflow else "ModuleNotFoundError: No module named 'tensorflow'")
    return Facts(executable="/venv/bin/python", tensorflow=tf, horovod=HorovodFacts(**hvd),  # type: ignore[arg-type]
                 mpi=MpiFacts(mpirun="/usr/bin/mpirun", mpirun_version="mpirun (Open MPI) 4.1.4"))


def test_healthy_facts() -> None:
    assert problems(facts()) == []
    assert horovod_matches(facts())
    assert report(facts())[-1] == "ok: ready to train"


def test_missing_horovod() -> None:
    missing = facts(path=None, version=None, built_for=None, mpi=False, gloo=False)
    assert problems(missing) == [
        "Horovod is not installed: build it for TensorFlow 2.21.0 with "
        "`PYTHON=/venv/bin/python bash scripts/install-horovod.sh`"
    ]
    assert not horovod_matches(missing)
    assert "Horovod      not installed" in report(missing)


def test_no_mpi_and_no_gloo() -> None:
    neither = facts(mpi=False, gloo=False)
    assert problems(neither) == [
        "Horovod 0.28.1 was built without MPI and without Gloo, so it cannot start ranks: "
        "rebuild it with `PYTHON=/venv/bin/python bash scripts/install-horovod.sh`"
    ]
    assert not horovod_matches(neither)


def test_one_controller_trains_but_setup_rebuilds() -> None:
    mpi_only = facts(gloo=False)
    assert problems(mpi_only) == []  # MPI alone can train
    assert not horovod_matches(mpi_only)  # but scripts/setup.sh wants both (elastic runs need Gloo)


def test_no_mpirun_is_a_problem_with_what_to_install() -> None:
    healthy_but_no_mpirun = facts()
    healthy_but_no_mpirun.mpi = MpiFacts()
    assert problems(healthy_but_no_mpirun) == [
        "mpirun is not on PATH: `hvdk8s run` starts its ranks with Open MPI's mpirun "
        "(Debian: apt-get install openmpi-bin; `bash scripts/setup.sh` installs it)"]
    assert not horovod_matches(healthy_but_no_mpirun)
    assert report(healthy_but_no_mpirun)[-1].startswith("problem: mpirun is not on PATH")


def test_unknown_build_record() -> None:
    (problem,) = problems(facts(built_for=None))
    assert problem.startswith("Horovod 0.28.1 has no metadata.json")


def test_tensorflow_missing() -> None:
    # Horovod cannot import without TensorFlow; that consequence is not reported as a second problem.
    broken = facts(tensorflow=None, error="ModuleNotFoundError: No module named 'tensorflow'")
    (problem,) = problems(broken)
    assert problem.startswith("TensorFlow does not import (ModuleNotFoundError: No module named 'tensorflow'): ")
    assert "bash scripts/setup.sh" in problem
    assert "TensorFlow   does not import: ModuleNotFoundError: No module named 'tensorflow'" in report(broken)
    assert not horovod_matches(broken)


def test_tensorflow_and_horovod_missing() -> None:
    assert problems(facts(tensorflow=None, path=None)) == [
        problems(facts(tensorflow=None))[0],
        "Horovod is not installed: once TensorFlow is, build it with "
        "`PYTHON=/venv/bin/python bash scripts/install-horovod.sh`",
    ]


def test_serving_api_is_reported_but_no_problem() -> None:
    # Training does not need TF Serving's API (`hvdk8s serve` and --grpc do): like mpirun, a report line only.
    missing = facts()
    assert (missing.serving_api, problems(missing)) == (ServingApiFacts(), [])
    assert ("TF Serving   not installed: `hvdk8s serve` and --grpc need it; install it with "
            "`/venv/bin/python -m pip install --no-deps 'tensorflow-serving-api==2.21.*'` (--no-deps: it requires "
            "the full `tensorflow` package, which would land next to tensorflow-cpu; its real needs, grpcio and "
            "protobuf, are already installed)") in report(missing)
    assert "TF Serving   not installed: `hvdk8s serve` and --grpc need it" in report(facts(tensorflow=None))
    broken = facts()
    broken.serving_api = ServingApiFacts(path="/venv/site-packages/tensorflow_serving", version="2.18.1",
                                         error="TypeError: Descriptors cannot be created directly.")
    assert ("TF Serving   2.18.1 (/venv/site-packages/tensorflow_serving), does not import: "
            "TypeError: Descriptors cannot be created directly.") in report(broken)
    assert problems(broken) == []
