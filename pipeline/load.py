"""Pipeline files -> a checked ``Pipeline``: strict keys, every problem reported with its field path.

Candidates' jobs go through the job-spec validators (the same checks as
``hvdk8s render``) under ``candidates[i].job``, with the pipeline's name prefix,
image, namespace and shared volume filled in; serving options through their
validator (the same checks as ``hvdk8s serving-manifests``) under ``serving``,
in the file's keys. Nothing is half-accepted: either the whole file is valid
or ``SpecError`` lists every problem found.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvdk8s.common.fields import (
    FieldError,
    at_least,
    invalid,
    join,
    name_problem,
    one_of,
    required as required_error,
    value_kind,
)
from hvdk8s.common.files import read_yaml
from hvdk8s.mpijob import parse
from hvdk8s.mpijob.files import SpecError, check_spec_data, is_mpijob
from hvdk8s.mpijob.spec import JobSpec
from hvdk8s.mpijob.validation import pod_hostname_problem
from hvdk8s.pipeline import naming, spec as s
from hvdk8s.serving.kube.options import OptionsError, ServingOptions, validate as validate_serving
from hvdk8s.serving.model.selection import METRICS

# Job-spec fields the pipeline sets for every candidate, and from where.
PIPELINE_SET = {"name": "the pipeline (each Workflow run's <workflow name>-<candidate>)",
                "namespace": "the pipeline's namespace", "sharedVolume": "the pipeline's sharedVolume"}
MAX_NAME = 40  # room for "-<candidate>" in job names and "-pipeline" in the service account
# Valid values for the required top-level fields, used only to go on checking when one was refused.
STAND_INS: dict[str, Any] = {"name": "pipeline", "image": "image", "sharedVolume": {"claimName": "claim"},
                             "serving": {"modelName": "model"}}
# PipelineFile fields the candidates' jobs and the serving options are derived from, and their keys.
DERIVED_FROM = {"name": "name", "image": "image", "namespace": "namespace", "shared_volume": "sharedVolume"}


def load_pipeline(path: str | os.PathLike[str]) -> s.Pipeline:
    """Read and check a pipeline file; job files it names are relative to its folder."""
    return from_data(read_yaml(path), str(path), Path(path).parent)


def from_data(data: Any, where: str, base_dir: Path) -> s.Pipeline:
    """Check every section, each whenever what it derives from is usable (the candidates' jobs and the
    serving options take the pipeline's name, image, namespace and volume): all problems at once."""
    errors: list[FieldError] = []
    if not isinstance(data, Mapping):
        raise SpecError(where, [invalid("<top level>", f"must be a mapping, got {value_kind(data)}")])
    top_fields = dict(data)
    raw_candidates = top_fields.pop("candidates", None)
    top = parse.from_mapping(s.PipelineFile, top_fields, errors)
    entries = _candidate_entries(raw_candidates, errors)
    if top is None:  # a required field missing or refused (reported): stand-ins let the rest be checked
        usable = {k: v for k, v in top_fields.items() if k not in STAND_INS or not _has_error(errors, k)}
        top = parse.from_mapping(s.PipelineFile, STAND_INS | usable, [])
        assert top is not None  # the stand-ins are valid
    _check_top(top, errors)
    load_test = _load_test(top.load_test, errors)
    given = _with_stand_ins(top, errors)
    candidates = [_candidate(given, i, entry, job, base_dir, errors) for i, entry, job in entries]
    errors += _serving_options(given)
    if errors:
        raise SpecError(where, errors)
    return s.Pipeline(
        name=top.name, image=top.image, namespace=top.namespace, shared_volume=top.shared_volume,
        data=top.data, candidates=tuple(c for c in candidates if c is not None), metric=top.selection.metric, serving=top.serving,
        load_test=load_test, deadlines=top.deadlines, local=top.local,
    )


def _has_error(errors: list[FieldError], key: str) -> bool:
    """Whether the top-level field ``key`` (or anything in it) was reported."""
    return any(e.path == key or e.path.startswith((f"{key}.", f"{key}[")) for e in errors)


def _with_stand_ins(top: s.PipelineFile, errors: list[FieldError]) -> s.PipelineFile:
    """``top`` with valid stand-ins for the fields the candidates and serving derive from that were reported,
    so their own problems are found without repeating those (a derived field is judged only on valid input)."""
    stand_in = parse.from_mapping(s.PipelineFile, STAND_INS, [])
    changes = {f: getattr(stand_in, f) for f, key in DERIVED_FROM.items() if _has_error(errors, key)}
    return dataclasses.replace(top, **changes)


def serving_options(pipeline: s.Pipeline | s.PipelineFile) -> ServingOptions:
    """The serving manifests' options: the model is read from the pipeline's shared volume."""
    sv = pipeline.serving
    return ServingOptions(
        name=sv.model_name, model_base_path=model_base_path(pipeline), pvc_claim=pipeline.shared_volume.claim_name,
        namespace=pipeline.namespace, tf_serving_version=sv.tf_serving_version, resources=sv.resources,
        autoscaling=sv.autoscaling, batching=sv.batching, kserve=sv.kserve, logger_url=sv.logger_url,
        logger_mode=sv.logger_mode,
    )


def model_base_path(pipeline: s.Pipeline | s.PipelineFile) -> str:
    """Serving versions' folder, relative to the shared volume: kept across runs, each run adds a version."""
    return f"{pipeline.name}/models/{pipeline.serving.model_name}"


def _candidate_entries(raw: Any, errors: list[FieldError]) -> list[tuple[int, s.CandidateEntry, Any]]:
    """The candidates whose job can be checked, with their index in the list."""
    if raw is None:
        errors.append(required_error("candidates", "required (a list of training jobs)"))
        return []
    if not isinstance(raw, list) or not raw:
        errors.append(invalid("candidates", f"must be a non-empty list, got {value_kind(raw)}"))
        return []
    entries, seen = [], set()
    for i, item in enumerate(raw):
        where = f"candidates[{i}]"
        if not isinstance(item, Mapping):
            errors.append(invalid(where, f"must be a mapping with name and job (or jobFile), got {value_kind(item)}"))
            continue
        fields = dict(item)
        job = fields.pop("job", None)
        entry = parse.from_mapping(s.CandidateEntry, fields, errors, where)
        if entry is None:
            continue
        if problem := name_problem(entry.name, "DNS-1123 label"):
            errors.append(invalid(f"{where}.name", f"{entry.name!r} {problem}"))
        elif entry.name in seen:
            errors.append(FieldError("Duplicate", f"{where}.name", f"{entry.name!r} is used by another candidate"))
        seen.add(entry.name)
        if (job is None) == (entry.job_file is None):
            errors.append(invalid(where, "give exactly one of job (an inline job spec) or jobFile"))
        elif job is not None and not isinstance(job, Mapping):
            errors.append(invalid(f"{where}.job", f"must be a mapping of job-spec fields, got {value_kind(job)}"))
        else:
            entries.append((i, entry, job))
    return entries


def _check_top(top: s.PipelineFile, errors: list[FieldError]) -> None:
    err = errors.append
    if problem := name_problem(top.name, limit=MAX_NAME):
        err(invalid("name", f"{top.name!r} {problem}"))
    if top.namespace is not None and (problem := name_problem(top.namespace, "DNS-1123 label")):
        err(invalid("namespace", f"{top.namespace!r} {problem}"))
    if top.shared_volume.read_only:
        err(invalid("sharedVolume.readOnly", "must be false: the steps write candidates and serving versions to it"))
    data = top.data
    errors += one_of("data.source", data.source, s.DATA_SOURCES)
    if data.source in ("imageFolder", "tfds") and not data.path:
        err(required_error("data.path", f"required for source {data.source} (relative to the shared volume)"))
    if data.source == "tfds" and not data.name:
        err(required_error("data.name", "required for source tfds (the prepared dataset's name)"))
    if data.path and (data.path.startswith("/") or ".." in Path(data.path).parts):
        err(invalid("data.path", f"{data.path!r} must be a relative path inside the shared volume"))
    errors += one_of("data.colorMode", data.color_mode, s.COLOR_MODES)
    errors += at_least("data.imageSize", data.image_size, 1)
    errors += one_of("selection.metric", top.selection.metric, METRICS)
    errors += at_least("local.ranks", top.local.ranks, 1)
    for f in dataclasses.fields(top.deadlines):
        errors += at_least(f"deadlines.{parse.camel(f.name)}", getattr(top.deadlines, f.name), 1)


def _load_test(raw: s.LoadTestFile, errors: list[FieldError]) -> s.LoadTest:
    for key in ("concurrency", "requests", "images"):
        errors += at_least(f"loadTest.{key}", getattr(raw, key), 1)
    p99 = _number(raw.max_p99_ms, "loadTest.maxP99Ms", errors, low=0.0, high=None)
    rate = _number(raw.max_error_rate, "loadTest.maxErrorRate", errors, low=0.0, high=1.0)
    return s.LoadTest(raw.concurrency, raw.requests, raw.images, p99, rate)


def _number(text: str | None, where: str, errors: list[FieldError], low: float, high: float | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        errors.append(FieldError("TypeInvalid", where, f"must be a number, got {text!r}"))
        return None
    if value < low or (high is not None and value > high):
        errors.append(invalid(where, f"must be between {low:g} and {high:g}, got {value:g}" if high is not None
                              else f"must be >= {low:g}, got {value:g}"))
    return value


def _candidate(top: s.PipelineFile, i: int, entry: s.CandidateEntry, job: Any, base_dir: Path,
               errors: list[FieldError]) -> s.Candidate | None:
    where = f"candidates[{i}].job"
    if entry.job_file is not None:
        where = f"candidates[{i}].jobFile ({entry.job_file})"
        job = read_yaml(base_dir / entry.job_file)
        if not isinstance(job, Mapping):
            errors.append(invalid(where, f"must be a mapping of job-spec fields, got {value_kind(job)}"))
            return None
        job = {k: v for k, v in job.items() if k not in PIPELINE_SET}  # a standalone spec names itself
    if is_mpijob(job):
        errors.append(invalid(where, "is an MPIJob manifest, not an hvdk8s job spec"))
        return None
    for key in sorted(PIPELINE_SET.keys() & job.keys()):
        errors.append(FieldError("Forbidden", join(where, key), f"set by {PIPELINE_SET[key]}; remove it here"))
    volume = dataclasses.asdict(top.shared_volume)
    mapping = {"image": top.image, **job, "name": f"{top.name}-{entry.name}",
               "sharedVolume": {parse.camel(k): v for k, v in volume.items()}}
    if top.namespace is not None:
        mapping["namespace"] = top.namespace
    job_spec, job_errors = check_spec_data(mapping, where)
    if job_spec is None:
        errors += job_errors
        return None
    if problem := _run_name_problem(top.name, entry.name, job_spec):
        errors.append(invalid(f"candidates[{i}].name", problem))
        return None
    return s.Candidate(entry.name, job_spec)


def _run_name_problem(pipeline: str, candidate: str, job: JobSpec) -> str | None:
    """The MPI Operator's name rule (v0.8.2 ``pkg/apis/kubeflow/validation/validation.go``, validateMPIJobName:
    ``<job>-worker-<N-1>`` must be a DNS-1035 label) on the MPIJob name a Workflow run gives the candidate.
    It covers the names derived from the job: its Service (the job name), its pods' job-name label and the
    launcher Job ``<job>-launcher``, whose name Kubernetes also puts in a label (at most 63 characters)."""
    name = naming.candidate_job(naming.longest_workflow_name(pipeline), candidate)
    if problem := pod_hostname_problem(name, job.elastic.max_workers if job.elastic else job.workers):
        return (f"{problem}: each Workflow run names this MPIJob <workflow name>-{candidate}, the workflow name "
                f"being {naming.generate_name(pipeline)!r} and {naming.RANDOM_SUFFIX} random characters; "
                "shorten the pipeline's or the candidate's name")
    return None


def _serving_options(top: s.PipelineFile) -> list[FieldError]:
    """The serving options' problems, under ``serving`` and in the file's keys (its ``modelName`` is the options'
    ``name``)."""
    if problem := name_problem(top.serving.model_name):
        return [invalid("serving.modelName", f"{top.serving.model_name!r} {problem}")]
    try:
        serving_options(top)
    except OptionsError as err:
        return validate_serving(err.options, "serving", _serving_key)
    return []


def _serving_key(option: str) -> str:
    """A ServingOptions option (dotted Python name) as its key under ``serving`` in a pipeline file."""
    return "modelName" if option == "name" else ".".join(parse.camel(part) for part in option.split("."))
