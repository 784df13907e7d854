"""hvdk8s as users get it: the sdist and the wheel built from this checkout without a package index, the wheel
installed into a fresh virtual environment, and every command's main path run from a folder outside the
repository, where neither the source tree nor ``../shared`` can be reached.

The fresh environment reuses .venv's TensorFlow, Horovod and other dependencies through a ``.pth`` line naming
.venv's site-packages (directories added that way do not get their own ``.pth`` files read, so .venv's editable
hvdk8s stays out); the wheel is installed first, into the empty environment, so pip sees nothing to replace.
"""
# Part of `make test` on purpose: the only test of the installed package (its package data, no source tree, no
# ../shared beside it). One module fixture builds and installs once; every command gets inputs small enough
# that the whole module stays around a minute on 2 cores.
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO

# The test material beside the checkout; the product's own `/shared` volume mount path is not one of these.
TEST_MATERIAL = re.compile(r"\.\./shared|shared/(?:measurements|schemas|peer)")
# Horovod Keras 2 script for `hvdk8s migrate`
HOROVOD_SCRIPT = """import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(lr=0.01 * hvd.size()))
"""


@dataclass(frozen=True)
class Installed:
    sdist: Path
    wheel: Path
    venv: Path
    package: Path  # the installed hvdk8s folder
    work: Path  # the users' folder: outside the repository, no ../shared beside it

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return {**env, "PATH": f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(self.venv),
                "HVDK8S_METRICS_PORT": "0"}

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``hvdk8s ARGS`` as installed, in ``work``; fails the test with its output unless it exits 0."""
        proc = subprocess.run([str(self.venv / "bin" / "hvdk8s"), *args], cwd=self.work, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            pytest.fail(f"hvdk8s {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        return proc


def _checked(argv: list[str], cwd: Path) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _source_copy(dest: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) in ``dest``: setuptools writes its egg-info where it builds."""
    listed = _checked(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], REPO)
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # not one deleted in the working tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    source, dist, venv = _source_copy(root / "src"), root / "dist", root / "venv"
    # pip --isolated: no pip configuration or PIP_* variables (this machine's point at local wheel folders); --no-index
    pip = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "-q"]
    sdist = Path(_checked([sys.executable, "-c", "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))",
                           str(dist)], source).strip().splitlines()[-1])
    _checked([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(dist / sdist)], root)
    (wheel,) = dist.glob("hvdk8s-*.whl")
    _checked([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    _checked([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], root)
    site = Path(_checked([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # .venv's, this interpreter's
    work = tmp_path_factory.mktemp("work")
    assert not (work.parent / "shared").exists() and REPO not in work.parents
    return Installed(dist / sdist, wheel, venv, site / "hvdk8s", work)


def test_sdist_has_what_a_build_and_the_set_up_need(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        names = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
    make_inputs = re.search(r"^SETUP_INPUTS := (.+)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    stacks = [f"scripts/stacks/{p.name}" for p in (REPO / "scripts" / "stacks").glob("tf-*.txt")]
    needed = {"pyproject.toml", "README.md", "LICENSE", "Makefile", "scripts/setup.sh", "scripts/install-horovod.sh",
              "Dockerfile.gpu", "Dockerfile.gpu.dockerignore", "examples/train_digits.py",
              "benchmarks/h100_training_rates.json", "benchmarks/model_layers.json", *make_inputs, *stacks}
    assert needed <= names, sorted(needed - names)
    assert len(stacks) >= 4 and not any(n.startswith(("benchmarks/reports/", "tests/")) for n in names)


def test_wheel_installs_the_package_data_and_names_no_test_material(installed: Installed) -> None:
    where = _checked([str(installed.venv / "bin" / "python"), "-c", "import hvdk8s; print(hvdk8s.__file__)"],
                     installed.work).strip()
    assert Path(where) == installed.package / "__init__.py"  # not .venv's editable install of the checkout
    for data in ("benchmarks/h100_training_rates.json", "benchmarks/model_layers.json", "mpijob/examples/cpu.yaml",
                 "pipeline/examples/digits.yaml", "serving/examples/digits-tfserving.yaml", "__init__.pyi"):
        assert (installed.package / data).is_file(), data
    wheel = set(zipfile.ZipFile(installed.wheel).namelist())
    assert not any("/reports/" in n for n in wheel) and "hvdk8s-0.1.0.dist-info/licenses/LICENSE" in wheel
    naming = [f"{path.relative_to(installed.package)}: {match.group(0)}" for path in sorted(installed.package.rglob("*"))
              if path.is_file() and path.suffix != ".pyc"
              for match in TEST_MATERIAL.finditer(path.read_text(errors="replace"))]
    assert naming == []


def test_doctor(installed: Installed) -> None:
    facts = json.loads(installed.run("doctor", "--json").stdout)
    assert facts["executable"] == str(installed.venv / "bin" / "python") and facts["horovod_matches"]


def in_checkout(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cwd: Path, *args: str) -> str:
    """What ``hvdk8s ARGS`` prints run from the checkout (in this process), in ``cwd``: the installed command must agree."""
    from hvdk8s.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_render_the_packaged_job_example(installed: Installed, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(installed.package / "mpijob" / "examples" / "cpu.yaml", installed.work / "job.yaml")
    rendered = installed.run("render", "job.yaml").stdout
    assert yaml.safe_load(rendered)["kind"] == "MPIJob"
    assert rendered == in_checkout(capsys, monkeypatch, installed.work, "render", "job.yaml")


def test_bench_report_only_on_a_committed_result(installed: Installed) -> None:
    out = installed.work / "headline"
    out.mkdir()
    shutil.copy(REPO / "benchmarks" / "reports" / "headline" / "results.json", out / "results.json")
    installed.run("bench", "--report-only", "headline/results.json")
    assert "NVIDIA H100" in (out / "report.md").read_text()  # the cost model's measured rates, from the package


def test_a_minimal_bench_run(installed: Installed) -> None:
    installed.run(
        "bench", "--quick", "--strategies", "hvdk8s", "--workloads", "mlp", "--mlp-width", "16", "--ranks", "1",
        "--no-tta", "--warmup", "1", "--steps", "2", "--windows", "1", "--models", "1", "--rounds", "1",
        "--sizes", "none", "--fusion-bytes", "none", "--repeats", "1", "--memcopy-bytes", "4K", "--emulated-rates", "none",
        "--out", "bench",
    )  # fmt: skip
    results = json.loads((installed.work / "bench" / "results.json").read_text())
    assert results["errors"] == []
    assert [(r["strategy"], r["workers"]) for r in results["raw"]["training"]] == [("hvdk8s", 1)]
    assert (installed.work / "bench" / "report.md").is_file()


def test_export_serve_predict(installed: Installed) -> None:
    from PIL import Image

    model, base = installed.work / "digits.keras", installed.work / "models" / "digits"
    _checked([str(installed.venv / "bin" / "python"), "-c",
              f"import hvdk8s; hvdk8s.models.cnn('cnn', seed=0).save({str(model)!r})"], installed.work)
    installed.run("export", str(model), "--base-path", str(base), "--class-names", ",".join("0123456789"))
    Image.new("L", (28, 28), 255).save(installed.work / "blank.png")
    serve = subprocess.Popen([str(installed.venv / "bin" / "hvdk8s"), "serve", str(base), "--port", "0",
                              "--grpc-port", "0"], cwd=installed.work, env=installed.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        ready = serve.stdout.readline()
        assert "http://" in ready, ready + serve.communicate(timeout=30)[1][-3000:]
        url = ready[ready.index("http://"):].split("/v1/")[0]
        printed = installed.run("predict", "blank.png", "--url", url).stdout
        assert re.fullmatch(r'blank\.png: class \d "\d" p=[\d.]+ \[[\d. ]+\]\n', printed), printed
    finally:
        serve.terminate()
        serve.communicate(timeout=30)


def test_serving_manifests(installed: Installed, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    args = ("serving-manifests", "digits", "--model-base-path", "digits")
    printed = installed.run(*args).stdout
    assert {doc["kind"] for doc in yaml.safe_load_all(printed)} >= {"Deployment", "Service"}
    assert printed == in_checkout(capsys, monkeypatch, installed.work, *args)


def test_pipeline_render_of_the_packaged_example(installed: Installed, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(installed.package / "pipeline" / "examples" / "digits.yaml", installed.work / "pipeline.yaml")
    workflow = installed.run("pipeline", "render", "pipeline.yaml").stdout
    assert yaml.safe_load(workflow)["kind"] == "Workflow"
    assert workflow == in_checkout(capsys, monkeypatch, installed.work, "pipeline", "render", "pipeline.yaml")


def test_migrate(installed: Installed) -> None:
    (installed.work / "train.py").write_text(HOROVOD_SCRIPT)
    installed.run("migrate", "--write", "train.py")
    migrated = (installed.work / "train.py").read_text()
    assert "import hvdk8s as hvd\n" in migrated and "SGD(learning_rate=0.01 * hvd.size())" in migrated
