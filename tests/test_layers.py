"""The import layers, checked by import-linter: no import cycles, and each layer imports only those below it.

    hvdk8s.cli                                  the command line: imports every package's cli
    hvdk8s.pipeline | hvdk8s.benchmarks         (independent of each other)
    hvdk8s.cluster  | hvdk8s.serving            Kubernetes jobs; serving
    hvdk8s.mpijob                               the job file and the manifests rendered from it
    hvdk8s.launcher | hvdk8s.migrate            local launching: mpirun/horovodrun argv, the hosts wait;
                                                the Horovod-script codemod (a tool, not the core)
    hvdk8s.<module> | hvdk8s.<sub-package>     the core (the folder ``hvdk8s/``): training library and
                                                neutral helpers (atomic writes, files and YAML, Kubernetes
                                                field rules, errors)

Inside the core, its top-level modules and sub-packages form layers of their own:

    hvdk8s.cli                                  the command line
    defaults | doctor                           ``default_callbacks``; ``hvdk8s doctor``
    observe                                     metrics, telemetry, progress bar, the observability callbacks
    callbacks | elastic | data | models         Horovod's ``callbacks`` and ``elastic``; datasets and models
    train                                       optimizer, fused update, rate schedule, fit's step call, loading,
                                                checkpoints, keras_compat
    collectives | runtime                       Horovod's collectives; init, ranks, devices and threads
    commtime | threads                          the allreduce clock; CPU thread policies
    common                                      atomic writes, files and YAML, Kubernetes field rules, errors,
                                                quiet TensorFlow, figures (no TensorFlow)

Inside ``hvdk8s.serving``, its sub-packages form layers of their own:

    hvdk8s.serving.cli                          the serving commands (export, select, serve, predict, loadtest)
    server | clients | kube                     the server; its clients and the load test; Kubernetes manifests
    model | api                                 export and selection; TF Serving's API contract (no server, no TF)

and so do ``hvdk8s.benchmarks``'s, by job (``__main__`` only runs ``cli``):

    hvdk8s.benchmarks.cli                       ``hvdk8s bench``: its flags, and which run they start
    harness                                     what each run drives and writes: the suite (locally or as cluster
                                                jobs), chaos runs, the serving benchmark, the callback study
    reporting | workers                         raw timings to summaries, cost model and report; the processes the
                                                harness starts (training, allreduce, chaos and synthetic workers)
    config | machine                            what a run measures (settings, knobs, Horovod's synthetic
                                                benchmarks); this machine (launching processes, its environment)
    emulation                                   hosts in network namespaces, their links, chaos hosts with sshd

Imports inside functions count too, so none can dodge a contract. The folders are installed as
``hvdk8s.<folder>`` (setuptools ``package-dir``), which import-linter cannot follow, so the test lays
them out under one ``hvdk8s/`` folder in a temporary directory first.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, package_dirs

pytestmark = pytest.mark.unit

LAYERS = [
    "hvdk8s.cli",
    "hvdk8s.pipeline | hvdk8s.benchmarks",
    "hvdk8s.cluster | hvdk8s.serving",
    "hvdk8s.mpijob",
    "hvdk8s.launcher | hvdk8s.migrate",
]
SERVING_LAYERS = [  # inside hvdk8s.serving (its __init__ imports nothing: the public names load lazily)
    "cli",
    "server | clients | kube",
    "model | api",
]
BENCHMARKS_LAYERS = [  # inside hvdk8s.benchmarks (its __init__ is empty; __main__ only runs cli)
    "cli",
    "harness",
    "reporting | workers",
    "config | machine",
    "emulation",
]
CORE_LAYERS = [  # inside the core, hvdk8s/ itself (its __init__ imports nothing: the public names load lazily)
    "cli",
    "defaults | doctor",
    "observe",
    "callbacks | elastic | data | models",
    "train",
    "collectives | runtime",
    "commtime | threads",
    "common",
]


def _staged_package(root: Path) -> list[str]:
    """Copy the package folders into ``root/hvdk8s``; return the subpackages' import names."""
    folders = package_dirs()
    ignore = shutil.ignore_patterns("__pycache__", "examples", "reports")
    for name, folder in folders.items():
        shutil.copytree(REPO / folder, root / name.replace(".", "/"), ignore=ignore)
    return [name for name in folders if name != "hvdk8s"]


def _modules(folder: Path, unplaced: set[str]) -> set[str]:
    """The names of ``folder``'s modules (but ``unplaced``) and sub-packages."""
    return {p.stem for p in folder.iterdir()
            if p.suffix == ".py" and p.stem not in unplaced or (p / "__init__.py").is_file()}  # fmt: skip


def test_no_import_cycles_and_every_layer_imports_only_those_below(tmp_path: Path) -> None:
    subpackages = _staged_package(tmp_path)
    core_modules = _modules(REPO / "hvdk8s", {"__init__"})
    core = sorted(f"hvdk8s.{m}" for m in core_modules - {"cli"})
    config = tmp_path / ".importlinter"
    config.write_text("\n".join([
        "[importlinter]", "root_package = hvdk8s", "",
        "[importlinter:contract:acyclic]", "name = no import cycles, at any depth", "type = acyclic_siblings",
        "ancestors = hvdk8s", "",
        "[importlinter:contract:layers]", "name = each layer imports only the layers below it", "type = layers",
        "layers =", *(f"    {layer}" for layer in LAYERS), "",
        "[importlinter:contract:serving]", "name = serving: each layer imports only the layers below it",
        "type = layers", "containers = hvdk8s.serving",
        "layers =", *(f"    {layer}" for layer in SERVING_LAYERS), "",
        "[importlinter:contract:benchmarks]", "name = benchmarks: each layer imports only the layers below it",
        "type = layers", "containers = hvdk8s.benchmarks",
        "layers =", *(f"    {layer}" for layer in BENCHMARKS_LAYERS), "",
        "[importlinter:contract:core-layers]", "name = core: each layer imports only the layers below it",
        "type = layers", "containers = hvdk8s",
        "layers =", *(f"    {layer}" for layer in CORE_LAYERS), "",
        "[importlinter:contract:core]", "name = the core imports nothing above it", "type = forbidden",
        "source_modules =", *(f"    {m}" for m in core),
        "forbidden_modules =", *(f"    {m}" for m in [*subpackages, "hvdk8s.cli"]), "",
    ]))  # fmt: skip
    assert set(subpackages) == {m.strip() for layer in LAYERS[1:] for m in layer.split("|")}  # every package placed
    for package, layers, unplaced in (("serving", SERVING_LAYERS, {"__init__"}),
                                      ("benchmarks", BENCHMARKS_LAYERS, {"__init__", "__main__"})):
        modules = _modules(tmp_path / "hvdk8s" / package, unplaced)
        assert modules == {m.strip() for layer in layers for m in layer.split("|")}, package  # every module placed
    assert core_modules == {m.strip() for layer in CORE_LAYERS for m in layer.split("|")}  # every core module placed
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), str(config), "--no-cache"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Contracts: 6 kept, 0 broken." in proc.stdout
