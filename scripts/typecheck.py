"""Type-check the package with mypy (``make lint``; settings in pyproject.toml's ``[tool.mypy]``).

The top-level folders are installed as ``hvdk8s.<folder>`` (setuptools ``package-dir``), a mapping mypy
cannot follow, so this lays the package out as it is imported -- symbolic links under one ``hvdk8s/``
folder in a temporary directory -- runs mypy there, and reports each error under its path in the repository.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs_hooks import package_dirs, stage_package  # the same layout the docs build stages (scripts/ is on sys.path)

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="hvdk8s-typecheck-") as tmp:
        stage_package(Path(tmp))
        proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                               "-p", "hvdk8s"], cwd=tmp, capture_output=True, text=True)  # fmt: skip
    out = proc.stdout + proc.stderr
    for name, folder in sorted(package_dirs().items(), key=lambda item: -len(item[0])):  # longest import name first
        out = out.replace(name.replace(".", "/") + "/", folder + "/")
    sys.stdout.write(out)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
