"""The wheel users install (the GPU image installs one) holds every subpackage and the public names' stub."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO, package_dirs


def test_wheel_has_every_subpackage_and_the_public_names_stub(tmp_path: Path) -> None:
    source = tmp_path / "src"  # built from a copy: setuptools leaves build/ and *.egg-info where it builds
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    folders = package_dirs()
    for folder in folders.values():
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("hvdk8s-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for stub in ("hvdk8s/__init__.pyi", "hvdk8s/serving/__init__.pyi", "hvdk8s/migrate/__init__.pyi"):
        assert stub in names, stub  # without it the package fails to import (lazy_loader reads it)
    for name, folder in folders.items():  # every package and sub-package of the checkout, at any depth
        for init in (REPO / folder).rglob("__init__.py"):
            inside = init.relative_to(REPO / folder).as_posix()
            assert f"{name.replace('.', '/')}/{inside}" in names, f"{folder}/{inside} is not in the wheel"
    # libcst (hvdk8s migrate's codemod) is an extra, not a need of the training library
    (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist: libcst")]  # the README, the long description, names it too
    assert requires == ['Requires-Dist: libcst==1.9.0; extra == "migrate"'], requires
    # the stub names only modules that exist, so every public name resolves
    stub = (REPO / "hvdk8s" / "__init__.pyi").read_text()
    for line in stub.splitlines():
        if line.startswith("from . import"):
            for module in (part.split(" as ")[0].strip() for part in line.removeprefix("from . import").split(",")):
                assert {f"hvdk8s/{module}.py", f"hvdk8s/{module}/__init__.py"} & names, module
        elif line.startswith("from ."):
            module = line.split()[1][1:]  # a dotted path for a sub-package's module: .train.optimizer
            assert f"hvdk8s/{module.replace('.', '/')}.py" in names, module


def test_public_names_resolve_lazily() -> None:
    code = (
        "import sys, hvdk8s; assert 'tensorflow' not in sys.modules; "
        "missing = [n for n in hvdk8s.__all__ if getattr(hvdk8s, n, None) is None]; print(missing)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-3000:]
