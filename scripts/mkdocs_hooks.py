"""MkDocs hooks (``hooks:`` in mkdocs.yml): the package as griffe can read it, and the command-line reference.

- The top-level folders are installed as ``hvdk8s.<folder>`` (pyproject's ``package-dir``), a mapping griffe
  cannot follow from the repository root: ``on_startup`` lays the package out as it is imported, symbolic links
  under ``out/docs-api/hvdk8s`` (scripts/typecheck.py stages mypy's the same way), the path mkdocs.yml gives mkdocstrings,
  so ``::: hvdk8s.serving.model.savedmodel.export`` resolves.
- ``on_page_markdown`` replaces the marker lines in docs/cli.md with every command's usage and arguments, read from
  the real parsers, so the page cannot drift from ``--help``: ``<!-- hvdk8s-cli-reference -->`` with the ``hvdk8s``
  command's (``hvdk8s.cli.build_parser()``, which each package's ``cli`` module registers into), and
  ``<!-- hvdk8s-cli-reference MODULE -->`` with those of ``python -m MODULE`` (``MODULE.build_parser()``), for the
  entry points that are not ``hvdk8s`` subcommands, such as ``hvdk8s.launcher.hosts`` in MPIJob launcher pods.
"""
from __future__ import annotations

import argparse
import html
import importlib
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
API_SOURCES = REPO / "out" / "docs-api"  # mkdocs.yml: mkdocstrings' python handler ``paths``
CLI_MARKER = re.compile(r"^<!-- hvdk8s-cli-reference(?: (?P<module>[\w.]+))? -->$", flags=re.M)
USAGE_WIDTH = 100  # columns of the usage blocks, whatever the terminal building the docs is


def package_dirs() -> dict[str, str]:
    """pyproject's ``package-dir``: import name -> folder in the repository."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def stage_package(root: Path = API_SOURCES) -> None:
    """Link each ``package-dir`` folder (and the core's modules and sub-packages) under ``root/hvdk8s``; idempotent.

    Links are only added or corrected, never the whole tree rebuilt, so two builds at once cannot trip over
    each other; links to modules that are gone are removed.
    """
    folders = package_dirs()
    links: dict[Path, Path] = {}
    for module in (REPO / folders["hvdk8s"]).iterdir():
        if module.suffix in (".py", ".pyi") or (module / "__init__.py").is_file():
            links[root / "hvdk8s" / module.name] = module
    for name, folder in folders.items():
        if name != "hvdk8s":
            links[root / name.replace(".", "/")] = REPO / folder
    (root / "hvdk8s").mkdir(parents=True, exist_ok=True)
    for link in (root / "hvdk8s").iterdir():
        if link.is_symlink() and link not in links:
            link.unlink(missing_ok=True)
    for link, target in links.items():
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink():
            link.unlink(missing_ok=True)
        try:
            link.symlink_to(target, target_is_directory=target.is_dir())
        except FileExistsError:  # another build made the same link meanwhile
            pass


def on_startup(command: str, dirty: bool) -> None:  # before any plugin reads mkdocstrings' paths
    stage_package()


def on_config(config: Any) -> Any:  # a build started from Python, where no on_startup runs
    stage_package()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if not CLI_MARKER.search(markdown):
        return markdown
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return CLI_MARKER.sub(lambda marker: cli_reference(entry_point_parser(marker["module"])), markdown)


def entry_point_parser(module: str | None) -> argparse.ArgumentParser:
    """The parser of ``hvdk8s`` (``module`` None) or of ``python -m module``: the module's ``build_parser()``."""
    parser: argparse.ArgumentParser = importlib.import_module(module or "hvdk8s.cli").build_parser()
    return parser


def cli_reference(parser: argparse.ArgumentParser, level: int = 2) -> str:
    """Markdown for ``parser`` and, one heading level down each time, every subcommand under it."""
    out = [f"{'#' * min(level, 6)} `{parser.prog}`", ""]
    if parser.description:
        out += [_text(parser.description, raw=_raw(parser)), ""]
    out += ["```text", _usage(parser).rstrip(), "```", ""]
    subcommands: list[argparse.ArgumentParser] = []
    for group in parser._action_groups:
        lines = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for name, sub in action.choices.items():
                    lines.append(f"- [`{name}`](#{_slug(sub.prog)}): {_text(helps.get(name) or '')}".rstrip(": "))
                    if sub not in subcommands:
                        subcommands.append(sub)
            else:
                lines.append(_argument(parser, action))
        if lines:
            out += [f"**{_text(group.title or 'arguments')}**", "", *lines, ""]
    if parser.epilog:
        out += [_text(parser.epilog, raw=_raw(parser)), ""]
    for sub in subcommands:
        out.append(cli_reference(sub, level + 1))
    return "\n".join(out)


def _argument(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        name = ", ".join(
            option if action.nargs == 0
            else f"{option} {formatter._format_args(action, formatter._get_default_metavar_for_optional(action))}"
            for option in action.option_strings
        )
    else:
        name = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
    parts = [f"- `{name}`"]
    help_text = formatter._expand_help(action) if action.help else ""
    if help_text:
        parts.append(": " + _text(help_text))
    facts = []  # what --help shows only in the usage line, unless the help text says it already
    if action.required and action.option_strings and "required" not in help_text:
        facts.append("required")
    if action.choices is not None and not isinstance(action.choices, dict) and "{" not in name:
        facts.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
    shown_default = action.nargs != 0 and action.default not in (None, argparse.SUPPRESS, "", [], ())
    if shown_default and "default" not in help_text.lower():
        facts.append(f"default `{action.default}`")
    if facts:
        parts.append(f" ({'; '.join(facts)})")
    return "".join(parts)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help()


def _raw(parser: argparse.ArgumentParser) -> bool:
    return issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter)


def _text(text: str, raw: bool = False) -> str:
    """Help text as literal Markdown: nothing in it can open a link, a tag, emphasis or a code span."""
    if raw:
        return "\n".join(["```text", text.strip("\n"), "```"])
    escaped = html.escape(" ".join(text.split()), quote=False)
    return re.sub(r"([\\`*_\[\]#|{}])", r"\\\1", escaped)


def _slug(prog: str) -> str:
    """The anchor the toc extension gives a heading ``prog`` (lower case, words joined by hyphens)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", prog).strip().lower())
