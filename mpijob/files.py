"""Reading job specs and manifests: the file edges of ``hvdk8s.mpijob``.

One path for every caller: parse strictly, default, validate (all errors at
once), then render once and check the result with the operator's own rules.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hvdk8s.common.atomic import write_text
from hvdk8s.common.errors import UserError
from hvdk8s.common.fields import FieldError, SpecError
from hvdk8s.common.files import read_yaml, to_yaml
from hvdk8s.mpijob import defaults, parse, validation
from hvdk8s.mpijob.render import KIND, render
from hvdk8s.mpijob.spec import JobSpec
from hvdk8s.mpijob.trainjob import checked_render_trainjob

__all__ = ["SpecError", "check_spec_data", "load_spec", "manifest_from_data", "manifest_from_file", "objects_from_file", "read_yaml",
           "to_yaml", "write_text"]


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any], *, origin: str | None = None,
              api: str = "mpijob") -> JobSpec:
    """Parse a job spec (file path or mapping): unknown fields rejected,
    defaults applied, then every rule checked (those of the controller ``api`` names:
    mpijob or trainjob); all errors raised together. ``origin`` names a mapping's
    source in messages (default "job spec")."""
    if isinstance(source, (str, os.PathLike)):
        data, where = read_yaml(source), str(source)
    else:
        data, where = source, origin or "job spec"
    if is_mpijob(data):
        raise UserError(f"{where}: is an MPIJob manifest, not an hvdk8s job spec (apply it as is)")
    spec, errors = check_spec_data(data, api=api)
    if spec is None:
        raise SpecError(where, errors)
    return spec


def check_spec_data(data: Any, path: str = "", api: str = "mpijob") -> tuple[JobSpec | None, list[FieldError]]:
    """A job spec's mapping parsed strictly and defaulted, and every problem (for ``api``, see
    ``validation.check_spec``) at its path under ``path``: the spec only when there are none."""
    parse_errors: list[FieldError] = []
    spec = parse.from_mapping(JobSpec, data, parse_errors, path)
    if spec is None:
        return None, parse_errors
    derived = defaults.derived_paths(spec, path)
    spec = defaults.with_defaults(spec)
    refused = {e.path for e in parse_errors}  # those fields kept their (valid) defaults
    errors = parse_errors + [e for e in validation.check_spec(spec, path, api) if e.path not in refused]
    if own := [e for e in errors if e.path not in derived]:
        errors = own  # a derived value is wrong only because a field it comes from is (workers: -2)
    return (None, errors) if errors else (spec, [])


def checked_render(spec: JobSpec, where: str) -> dict[str, Any]:
    """Render once and hold the result to the operator's rules: a failure is an
    hvdk8s bug, but one the user sees as an error instead of a silent MPIJob."""
    manifest = render(spec)
    if errors := validation.check_manifest(manifest):
        raise SpecError(where, errors)
    return manifest


def is_mpijob(data: Any) -> bool:
    """A ready MPIJob manifest, used as is, rather than an hvdk8s job spec."""
    return isinstance(data, Mapping) and data.get("kind") == KIND


def manifest_from_data(data: Any, where: str, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """An MPIJob as is (after the operator's checks; ``warn`` gets what it allows
    but is likely wrong, default stderr), or a job spec rendered; ``where`` names the source."""
    if is_mpijob(data):
        if errors := validation.check_manifest(data):
            raise SpecError(where, errors)
        for line in validation.manifest_warnings(data):
            (warn or _stderr)(f"hvdk8s: warning: {where}: {line}")
        return dict(data)
    return checked_render(load_spec(data, origin=where), where)


def manifest_from_file(path: str | os.PathLike[str], warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The manifest of an MPIJob or job-spec file (see ``manifest_from_data``)."""
    return manifest_from_data(read_yaml(path), str(path), warn)


def objects_from_file(path: str | os.PathLike[str], api: str = "mpijob") -> list[dict[str, Any]]:
    """What ``submit`` creates, in order: the MPIJob (a ready one as is, or a job spec rendered), or with
    ``api="trainjob"`` a job spec's TrainingRuntime and TrainJob."""

    data, where = read_yaml(path), str(path)
    if api == "trainjob":
        if is_mpijob(data):
            raise UserError(f"{where}: --api trainjob needs a job spec, not an MPIJob manifest")
        return checked_render_trainjob(load_spec(data, origin=where, api=api), where)
    return [manifest_from_data(data, where)]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
