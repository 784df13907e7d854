"""Type-check the package with mypy (``make lint``; settings in pyproject.toml's ``[tool.mypy]``).

The top-level folders are installed as ``hvdk8s.<folder>`` (setuptools ``package-dir``), a mapping mypy
cannot follow, so this lays the package out as it is imported -- symbolic links under one ``hvdk8s/``
folder in a temporary directory -- runs mypy there, and reports each error under its path in the repository.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def stage(root: Path, package_dirs: dict[str, str]) -> None:
    """Link every ``package-dir`` folder (and the core's modules and sub-packages) under ``root/hvdk8s``."""
    core = root / "hvdk8s"
    core.mkdir()
    for module in (REPO / package_dirs["hvdk8s"]).iterdir():
        if module.suffix in (".py", ".pyi") or (module / "__init__.py").is_file():
            (core / module.name).symlink_to(module, target_is_directory=module.is_dir())
    for name, folder in package_dirs.items():
        if name != "hvdk8s":
            (root / name.replace(".", "/")).symlink_to(REPO / folder, target_is_directory=True)


def main() -> int:
    package_dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    with tempfile.TemporaryDirectory(prefix="hvdk8s-typecheck-") as tmp:
        stage(Path(tmp), package_dirs)
        proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                               "-p", "hvdk8s"], cwd=tmp, capture_output=True, text=True)  # fmt: skip
    out = proc.stdout + proc.stderr
    for name, folder in sorted(package_dirs.items(), key=lambda item: -len(item[0])):  # longest import name first
        out = out.replace(name.replace(".", "/") + "/", folder + "/")
    sys.stdout.write(out)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
