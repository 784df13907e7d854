"""The documentation site builds with warnings as errors, and the README stays a front door.

``mkdocs build --strict`` fails on a page missing from the navigation, a broken link or anchor, and an
API-reference docstring that griffe cannot parse; every public name of the training API must have a
docstring, since a missing one renders as nothing rather than failing the build. The public names
(``hvdk8s``'s and ``hvdk8s.serving``'s exports, and everything the reference pages render) are all in the
reference, and each docstring has the Google sections that make the reference say what its arguments
and results are: ``Args:`` naming every argument, ``Returns:`` when it returns something.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from griffe import Docstring, DocstringSectionKind

from conftest import REPO

pytestmark = pytest.mark.unit

README_BUDGET_LINES = 250
REFERENCE_PAGES = ["reference.md", "serving-api.md", "cli.md"]
PUBLIC_MODULES = ["hvdk8s.runtime", "hvdk8s.train.optimizer", "hvdk8s.callbacks", "hvdk8s.defaults",
                  "hvdk8s.train.checkpoint", "hvdk8s.train.loading", "hvdk8s.elastic", "hvdk8s.data", "hvdk8s.models",
                  "hvdk8s.observe.observability"]  # fmt: skip


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "DistributedOptimizer" in reference and "backward_passes_per_step" in reference
    serving = (tmp_path / "site" / "serving-api" / "index.html").read_text()
    assert "class_names" in serving and "model_config_file" in serving
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "hvdk8s-cli-reference" not in cli  # the hook replaced its marker
    from hvdk8s.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert all(f'id="hvdk8s-{name}"' in cli for name in commands), [n for n in commands if f"hvdk8s-{n}" not in cli]


def test_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_BUDGET_LINES
    first_screen = "\n".join(readme.splitlines()[:80])
    for needed in ("make demo", "make test", "| `mpijob/` | `hvdk8s.mpijob` |"):
        assert needed in first_screen, needed
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_training_api_has_docstrings(module: str) -> None:
    mod = importlib.import_module(module)
    assert inspect.getdoc(mod), module
    public = getattr(mod, "__all__", None) or [
        name for name, obj in vars(mod).items()
        if not name.startswith("_") and getattr(obj, "__module__", None) == module
        and (inspect.isclass(obj) or inspect.isfunction(obj))
    ]  # fmt: skip
    missing = [name for name in public if not (getattr(mod, name).__doc__ or "").strip()]  # its own, not inherited
    assert not missing, f"{module}: no docstring for {missing}"


def _public_members(module: str) -> dict[str, object]:
    """The functions and classes a ``::: module`` directive renders: its own, not what it imports."""
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None) or [
        name for name, obj in vars(mod).items()
        if not name.startswith("_") and getattr(obj, "__module__", None) == module
        and (inspect.isclass(obj) or inspect.isfunction(obj))
    ]  # fmt: skip
    return {f"{module}.{name}": getattr(mod, name) for name in names}


def _rendered() -> dict[str, object]:
    """Every function and class the reference pages render, by its full name."""
    found: dict[str, object] = {}
    for page in REFERENCE_PAGES:
        for target in re.findall(r"^::: (\S+)", (REPO / "docs" / page).read_text(), flags=re.M):
            try:
                found.update(_public_members(target))
            except ModuleNotFoundError:
                module, _, name = target.rpartition(".")
                found[target] = getattr(importlib.import_module(module), name)
    return found


def _exported() -> dict[str, object]:
    """``hvdk8s``'s and ``hvdk8s.serving``'s public names that hvdk8s defines (not Horovod's re-exports)."""
    found = {}
    for package in ("hvdk8s", "hvdk8s.serving"):
        mod = importlib.import_module(package)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith("hvdk8s"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def _missing_sections(obj: Any) -> list[str]:
    """What the docstring of a function or class (with its own public methods) lacks, in words."""
    if inspect.isclass(obj):
        problems = []
        init = next((c.__dict__["__init__"] for c in obj.__mro__
                     if "__init__" in c.__dict__ and c.__module__.startswith("hvdk8s")), None)  # fmt: skip
        if init is not None:
            problems += _missing_sections_of(obj, init, returns=False)
        inherited = {name for base in obj.__mro__[1:] for name in vars(base)}
        for name, member in vars(obj).items():
            if not name.startswith("_") and inspect.isfunction(member) and name not in inherited:
                problems += [f"{name}: {problem}" for problem in _missing_sections_of(member, member, returns=True)]
        return problems
    return _missing_sections_of(obj, obj, returns=True)


def _missing_sections_of(documented: Any, function: Any, *, returns: bool) -> list[str]:
    text = inspect.getdoc(documented) or ""
    sections = Docstring(text).parse("google", warn_missing_types=False, warn_unknown_params=False)
    kinds = {section.kind for section in sections}
    signature = inspect.signature(function)
    params = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    documented_names = {
        item.name.lstrip("*") for section in sections if section.kind is DocstringSectionKind.parameters
        for item in section.value
    }  # fmt: skip
    problems = []
    if not text:
        problems.append("no docstring")
    if params and DocstringSectionKind.parameters not in kinds:
        problems.append("no Args: section")
    elif missing := [p.name for p in params if p.name not in documented_names]:
        problems.append(f"Args: does not name {missing}")
    annotation = signature.return_annotation
    if returns and annotation not in ("None", "NoReturn", None) and not (kinds & {
        DocstringSectionKind.returns, DocstringSectionKind.yields
    }):  # fmt: skip
        problems.append("no Returns: section")
    return problems


def test_public_api_is_in_the_reference() -> None:
    rendered = _rendered()
    left_out = sorted(set(_exported()) - set(rendered))
    assert not left_out, f"public names missing from docs/{{{','.join(REFERENCE_PAGES)}}}: {left_out}"


def test_public_api_documents_arguments_and_results() -> None:
    names = {**_rendered(), **_exported()}
    missing = {name: problems for name, obj in sorted(names.items()) if (problems := _missing_sections(obj))}
    assert not missing, "docstrings without their Google sections:\n" + "\n".join(
        f"  {name}: {'; '.join(problems)}" for name, problems in missing.items()
    )


def test_cli_page_has_the_launcher_hosts_entry_point() -> None:
    """``python -m hvdk8s.launcher.hosts``, which the rendered launchers run, is its own section of the Command line
    page, generated from its parser as the ``hvdk8s`` commands are (the strict build checks the page's link to it)."""
    from importlib.util import module_from_spec, spec_from_file_location

    from hvdk8s.launcher.hosts import build_parser

    spec = spec_from_file_location("mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.on_page_markdown((REPO / "docs" / "cli.md").read_text(), page=None, config=None, files=None)
    assert "hvdk8s-cli-reference" not in page  # every marker replaced
    heading = "\n## `python -m hvdk8s.launcher.hosts`\n"
    assert heading in page
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    assert "usage: python -m hvdk8s.launcher.hosts" in section and "{ready,wait}" in section
    options = [option for action in build_parser()._actions for option in action.option_strings]
    assert {"--port", "--hostfile", "--timeout", "--identity"} <= set(options)
    assert all(f"- `{option}" in section or f", {option}" in section for option in options), section
