"""Kubeflow MPIJobs (kubeflow.org/v2beta1) and Trainer TrainJobs from typed hvdk8s job specs.

    spec = load_spec("job.yaml")      # strict parse, defaults, the operator's rules
    manifest = render(spec)           # dict for kubectl apply / the API
    objects = render_trainjob(spec)   # [TrainingRuntime, TrainJob] (Kubeflow Trainer v2)
    print(to_yaml(manifest))
"""
from hvdk8s.mpijob.files import SpecError, load_spec, manifest_from_file, objects_from_file, to_yaml
from hvdk8s.mpijob.render import launcher_command, render, render_podmonitor
from hvdk8s.mpijob.spec import JobSpec
from hvdk8s.mpijob.trainjob import render_trainjob
from hvdk8s.mpijob.validation import check_manifest

__all__ = [
    "JobSpec",
    "SpecError",
    "check_manifest",
    "launcher_command",
    "load_spec",
    "manifest_from_file",
    "objects_from_file",
    "render",
    "render_podmonitor",
    "render_trainjob",
    "to_yaml",
]
