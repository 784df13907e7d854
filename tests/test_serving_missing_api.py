"""Without tensorflow-serving-api (``pip install -e .`` into one's own TensorFlow does not bring it), every
command that needs TF Serving's gRPC stubs exits 2 with the install command, and ``hvdk8s doctor`` reports it.

The package is made unimportable the way Python documents: ``sys.modules["tensorflow_serving"] = None``, set
by a ``sitecustomize`` on PYTHONPATH before the CLI starts (the installed package stays untouched)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def without_serving_api(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a CLI process in which ``import tensorflow_serving`` raises ModuleNotFoundError."""
    folder = tmp_path_factory.mktemp("no_serving_api")
    (folder / "sitecustomize.py").write_text('import sys\nsys.modules["tensorflow_serving"] = None\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def install_command() -> str:
    import tensorflow as tf

    minor = ".".join(tf.__version__.split(".")[:2])
    return f"`{sys.executable} -m pip install --no-deps 'tensorflow-serving-api=={minor}.*'`"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hvdk8s.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args", [
    ["serve", "models/digits"],
    ["serve", "--model_config_file", "models.config"],
    ["predict", "--grpc", "--url", "127.0.0.1:8500", "{image}"],
    ["loadtest", "--grpc", "127.0.0.1:8500"],
], ids=["serve", "model_config_file", "predict", "loadtest"])
def test_commands_name_the_install_command(args: list[str], without_serving_api: dict[str, str],
                                           install_command: str, tmp_path: Path) -> None:
    image = tmp_path / "digit.png"
    image.write_bytes(b"\x89PNG")  # read, never sent: the check comes first
    proc = cli(without_serving_api, *(arg.format(image=image) for arg in args))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"hvdk8s {args[0]}: error: TF Serving's gRPC API (Python package tensorflow_serving) is not installed: "
        f"install it with {install_command} (--no-deps: it requires the full `tensorflow` package, which would "
        "land next to tensorflow-cpu; its real needs, grpcio and protobuf, are already installed)")
    assert "Traceback" not in proc.stderr


def test_doctor_reports_it_but_no_problem(without_serving_api: dict[str, str], install_command: str) -> None:
    proc = cli(without_serving_api, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # training needs no TF Serving
    lines = proc.stdout.splitlines()
    assert (f"TF Serving   not installed: `hvdk8s serve` and --grpc need it; install it with {install_command} "
            "(--no-deps: it requires the full `tensorflow` package, which would land next to tensorflow-cpu; "
            "its real needs, grpcio and protobuf, are already installed)") in lines
    assert lines[-1] == "ok: ready to train"
