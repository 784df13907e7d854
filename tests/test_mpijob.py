"""hvdk8s.mpijob: strict job-spec parsing, defaulting, the MPI Operator's rules,
exact rendered manifests, elastic and metrics wiring, and ``hvdk8s render``."""
from __future__ import annotations

import argparse
import copy
import os
import shutil
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvdk8s.common.errors import UserError
from hvdk8s.common.files import read_yaml
from hvdk8s.launcher.mpirun import DEFAULT_TCP_EAGER_LIMIT, AllreduceAlgorithm, mpirun_argv, tcp_eager_mca
from hvdk8s.mpijob import (
    SpecError,
    check_manifest,
    cli,
    load_spec,
    manifest_from_file,
    render,
    to_yaml,
)
from hvdk8s.mpijob.files import check_spec_data

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "mpijob" / "examples"
WAIT = ["python", "-m", "hvdk8s.launcher.hosts", "wait"]
BASE = {"name": "digits", "image": "img:1", "command": ["python", "/app/examples/train_digits.py"]}
FORWARDED = ["HOROVOD_FUSION_THRESHOLD", "HVDK8S_JOB_NAME", "HVDK8S_METRICS_PORT", "LD_LIBRARY_PATH",
             "NCCL_DEBUG", "PATH", "PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL"]  # fmt: skip


def mpirun_of(container: dict[str, Any]) -> list[str]:
    """The launcher's mpirun argv: what the wait for the workers' sshd runs once they answer."""
    command = container["command"]
    assert command[:len(WAIT)] == WAIT, command
    return command[command.index("--") + 1:]


def messages(errors: list[Any]) -> list[str]:
    return [str(e) for e in errors]


def errors_of(fields: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(fields)
    return info.value.errors


def launcher(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


def worker_pod(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def run_render(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hvdk8s")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["render", *argv])
    return args.handler(args)


# ---- checked-in examples (goldens) -----------------------------------------


@pytest.mark.parametrize("name", ["cpu", "gpu", "elastic", "kueue", "volcano", "rdma"])
def test_examples_match_what_render_produces(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    checked_in = (EXAMPLES / f"{name}.mpijob.yaml").read_text()
    assert run_render(str(EXAMPLES / f"{name}.yaml")) == 0
    rendered = capsys.readouterr().out
    assert rendered == checked_in, (
        f"mpijob/examples/{name}.mpijob.yaml is stale; regenerate with:\n"
        f"  hvdk8s render mpijob/examples/{name}.yaml -o mpijob/examples/{name}.mpijob.yaml"
    )
    assert run_render(str(EXAMPLES / f"{name}.yaml"), "-o", str(tmp_path / "out.yaml")) == 0
    assert (tmp_path / "out.yaml").read_text() == checked_in
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]  # no temp file left behind


def test_cpu_example_exact_launcher_and_worker():
    manifest = render(load_spec(EXAMPLES / "cpu.yaml"))
    expected_argv = [
        "mpirun", "-np", "2", "--allow-run-as-root", "-bind-to", "none", "-map-by", "slot", "--tag-output",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib", "-mca", "btl_tcp_eager_limit", "16777216",
        "-mca", "btl_tcp_max_send_size", "16777216", "-mca", "btl_tcp_rndv_eager_limit", "16777216",
        "-mca", "mpi_yield_when_idle", "1",
        "-x", "HOROVOD_FUSION_THRESHOLD", "-x", "HVDK8S_JOB_NAME", "-x", "HVDK8S_METRICS_PORT",
        "-x", "LD_LIBRARY_PATH", "-x", "NCCL_DEBUG", "-x", "PATH", "-x", "PYTHONUNBUFFERED", "-x", "TF_CPP_MIN_LOG_LEVEL",
        "python", "/app/examples/train_digits.py", "--epochs", "12",
    ]  # fmt: skip
    # mpirun behind the wait for every worker's sshd (at most workerWaitSeconds, default an hour) ...
    assert launcher(manifest)["command"] == [*WAIT, "--port", "2222", "--timeout", "3600", "--", *expected_argv]
    # ... which is exactly what `hvdk8s run` builds locally.
    command = ["python", "/app/examples/train_digits.py", "--epochs", "12"]
    assert expected_argv == mpirun_argv(2, command, env_names=FORWARDED, allow_run_as_root=True)
    assert launcher(manifest)["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                               "limits": {"cpu": "500m", "memory": "1Gi"}}  # fmt: skip
    assert "volumeMounts" not in launcher(manifest)
    pod = worker_pod(manifest)
    assert pod["containers"][0]["command"] == ["/usr/sbin/sshd", "-De"]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "tolerations" not in pod and "nodeSelector" not in pod and "securityContext" not in pod
    assert manifest["spec"] | {"mpiReplicaSpecs": None} == {
        "slotsPerWorker": 1,
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                      # the workers: the launcher waits for them; minResources what they request together
                      "schedulingPolicy": {"minAvailable": 2, "minResources": {"cpu": "4", "memory": "8Gi"}}},
        "launcherCreationPolicy": "WaitForWorkersReady",
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": "/root/.ssh",
        "mpiReplicaSpecs": None,
    }


def test_gpu_example_wiring():
    spec = load_spec(EXAMPLES / "gpu.yaml")
    manifest = render(spec)
    command = mpirun_of(launcher(manifest))
    assert command[:3] == ["mpirun", "-np", "8"] and "--allow-run-as-root" not in command
    assert ["-x", "TF_GPU_ALLOCATOR"] == command[command.index("TF_GPU_ALLOCATOR") - 1 : command.index("TF_GPU_ALLOCATOR") + 1]
    assert "nvidia.com/gpu" not in str(launcher(manifest)["resources"])  # the launcher never takes a GPU
    pod = worker_pod(manifest)
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": 4}
    assert container["command"] == ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    assert manifest["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    assert pod["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "fsGroup": 1000}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "training-high"
    launcher_pod = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert launcher_pod["priorityClassName"] == "training-high" and "nodeSelector" not in launcher_pod
    # the shared volume is mounted at the same path in every pod
    shared = {"name": "shared", "mountPath": "/shared"}
    assert shared in container["volumeMounts"] and shared in launcher(manifest)["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    # 2, not the operator's default 3: the launcher is created only once both workers run (issue 608)
    # ... and minResources what those 2 workers request (the operator would count the launcher instead of one)
    assert manifest["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 2, "queue": "training", "minResources": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"}}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["HOROVOD_FUSION_THRESHOLD"] == "134217728"
    assert env["HOROVOD_TIMELINE"] == "/shared/digits-gpu/timeline.json"


# ---- strict parsing ---------------------------------------------------------


def test_unknown_fields_rejected_with_paths_all_at_once():
    errors = errors_of(BASE | {
        "slotPerWorker": 4,
        "resources": {"worker": {"cpu": "1", "memory": "1Gi", "gpus": 1}},
        "scheduling": {"tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "efect": "NoSchedule"}]},
        "runPolicy": {"cleanupPolicy": "All"},
    })  # fmt: skip
    assert errors == [
        "slotPerWorker: unknown field (did you mean 'slotsPerWorker'?)",
        "resources.worker.gpus: unknown field (known: cpu, extra, memory)",
        "scheduling.tolerations[1].efect: unknown field (did you mean 'effect'?)",
        "runPolicy.cleanupPolicy: unknown field (did you mean 'cleanPodPolicy'?)",
    ]


def test_types_and_required_fields():
    errors = errors_of({"image": "img:1", "workers": "two", "gpu": "yes", "command": "python t.py",
                        "env": {"A": True}, "elastic": {"minWorkers": 1}})  # fmt: skip
    assert errors == [
        "workers: must be an integer, got string 'two'",
        "gpu: must be true or false, got string 'yes'",
        "command: must be a list, got string 'python t.py'",
        "env.A: must be a string, got boolean true (quote it)",
        "elastic.maxWorkers: required",
        "name: required",
    ]


def test_scalars_become_text_and_defaults_fill_in():
    spec = load_spec(BASE | {"command": ["python", "t.py", "--epochs", 5, "--lr", 0.1],
                             "resources": {"worker": {"cpu": 4, "memory": "8Gi"}}})  # fmt: skip
    assert spec.command == ("python", "t.py", "--epochs", "5", "--lr", "0.1")
    assert spec.resources.worker.cpu == "4"
    assert spec.resources.launcher.cpu == "500m"  # sibling default kept
    assert (spec.namespace, spec.workers, spec.slots_per_worker, spec.np) == (None, 2, 1, 2)
    assert spec.ssh_auth_mount_path == "/root/.ssh" and spec.scheduling.tolerations == ()


def test_file_errors_name_the_file(tmp_path: Path):
    with pytest.raises(UserError, match=r"nope\.yaml: no such file"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match=r"bad\.yaml: not valid YAML"):
        load_spec(bad)
    twice = tmp_path / "twice.yaml"
    twice.write_text("name: a\nworkers: 2\nresources:\n  worker: {cpu: 1}\nworkers: 4\n")
    with pytest.raises(UserError) as info:  # PyYAML alone would keep workers: 4 without a word
        load_spec(twice)
    assert str(info.value).startswith(f"{twice}: not valid YAML: key 'workers' given twice (first on line 2)\n")
    assert "line 5, column 1" in str(info.value)
    merged = tmp_path / "merged.yaml"  # a merge brings keys in that the mapping may give again, at any depth
    merged.write_text("base: &b {cpu: 1, memory: 1Gi}\nworker:\n  <<: *b\n  cpu: 4\n"
                      "group:\n  mid: &m\n    <<: *b\n    cpu: 2\ntop:\n  <<: *m\n"
                      "both:\n  <<: [*m, *b]\n")
    assert read_yaml(merged) == yaml.safe_load(merged.read_text()) == {
        "base": {"cpu": 1, "memory": "1Gi"}, "worker": {"cpu": 4, "memory": "1Gi"},
        "group": {"mid": {"cpu": 2, "memory": "1Gi"}}, "top": {"cpu": 2, "memory": "1Gi"},
        "both": {"cpu": 2, "memory": "1Gi"}}
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.yaml: not UTF-8 text \(byte 9\)"):
        load_spec(latin1)
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(BASE | {"worker": 3}))
    with pytest.raises(SpecError) as info:
        load_spec(typo)
    assert str(info.value) == f"{typo}: invalid:\n  worker: unknown field (did you mean 'workers'?)"
    listing = tmp_path / "list.yaml"
    listing.write_text("- name: x\n")
    with pytest.raises(SpecError) as info:
        load_spec(listing)
    assert info.value.errors == ["<top level>: must be a mapping, got a list"]
    mpijob = tmp_path / "job.yaml"
    mpijob.write_text(to_yaml(render(load_spec(BASE))))
    with pytest.raises(UserError, match="is an MPIJob manifest, not an hvdk8s job spec"):
        load_spec(mpijob)


# ---- the operator's rules, as job-spec errors --------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"workers": 0}, "workers: must be >= 1, got 0"),
        ({"slotsPerWorker": 0}, "slotsPerWorker: 0 slots give mpirun no host to start a rank on: set the ranks "
                                "per worker (= GPUs per worker with gpu: true)"),
        ({"slotsPerWorker": -1}, "slotsPerWorker: must be >= 1, got -1"),
        ({"restartPolicy": {"worker": "Always"}}, "restartPolicy.worker: 'Always' is not one of Never, OnFailure"),
        ({"restartPolicy": {"launcher": "ExitCode"}}, "restartPolicy.launcher: 'ExitCode' is not one of Never, OnFailure"),
        ({"runPolicy": {"cleanPodPolicy": "Finished"}}, "runPolicy.cleanPodPolicy: 'Finished' is not one of None, Running, All"),
        ({"runPolicy": {"backoffLimit": -1}}, "runPolicy.backoffLimit: must be >= 0, got -1"),
        ({"runPolicy": {"activeDeadlineSeconds": 0}}, "runPolicy.activeDeadlineSeconds: must be >= 1, got 0"),
        ({"launcherCreationPolicy": "Eager"}, "launcherCreationPolicy: 'Eager' is not one of AtStartup, WaitForWorkersReady"),
        ({"mpiImplementation": "MPICH"}, "mpiImplementation: 'MPICH': hvdk8s launches with Open MPI's mpirun; only OpenMPI"),
        ({"name": "Digits"}, "name: pod hostname 'Digits-worker-1' is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"),
        ({"name": "1digits"}, "name: pod hostname '1digits-worker-1' is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"),
        ({"resources": {"worker": {"cpu": "2 cores", "memory": "4G"}}}, "resources.worker.cpu: '2 cores' is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)"),
        ({"env": {"NCCL_DEBUG": "INFO"}}, "env.NCCL_DEBUG: set by hvdk8s from nccl.debug; set it there"),
        ({"env": {"1BAD": "x"}}, "env.1BAD: not a valid environment variable name"),
        ({"scheduling": {"gpuProduct": "NVIDIA-A100"}}, "scheduling.gpuProduct: only for GPU jobs (gpu: true)"),
        ({"gpu": True, "scheduling": {"gpuProduct": "NVIDIA A100"}}, "scheduling.gpuProduct: 'NVIDIA A100' is not a node label value, e.g. NVIDIA-A100-SXM4-80GB"),
        ({"scheduling": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}}, "scheduling.tolerations[0].value: must be empty when operator is Exists"),
        ({"sharedVolume": {"claimName": "data", "mountPath": "/dev"}}, "sharedVolume.mountPath: '/dev' overlaps /dev/shm (shmSize)"),
        ({"sharedVolume": {"claimName": "Data_1"}}, "sharedVolume.claimName: 'Data_1' is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"),
        ({"user": {"uid": 0}}, "user.uid: must be >= 1, got 0"),
        ({"metrics": {"port": 2221}, "slotsPerWorker": 2}, "metrics.port: ranks use ports 2221..2222, which include sshPort 2222"),
        ({"metrics": {"port": 65535}, "slotsPerWorker": 2}, "metrics.port: ranks use ports 65535..65536, past 65535"),
        ({"nccl": {"debug": "LOUD"}}, "nccl.debug: 'LOUD' is not one of VERSION, WARN, INFO, TRACE"),
        ({"horovod": {"timeline": "timeline.json"}}, "horovod.timeline: 'timeline.json' must be an absolute path"),
        # Negative quantities: resource.Quantity parses them, the API server refuses them as requests and
        # limits. Those with a unit once crashed the PodGroup's minResources defaulting (before validation).
        ({"resources": {"worker": {"cpu": "1", "memory": "-1Gi"}}}, "resources.worker.memory: must not be negative, got '-1Gi'"),
        ({"resources": {"worker": {"cpu": "-500m", "memory": "1Gi"}}}, "resources.worker.cpu: must not be negative, got '-500m'"),
        ({"resources": {"worker": {"cpu": "1", "memory": "1Gi", "extra": {"example.com/dev": "-1Ki"}}}},
         "resources.worker.extra.example.com/dev: must not be negative, got '-1Ki'"),
        ({"resources": {"worker": {"cpu": "1", "memory": "-1"}}}, "resources.worker.memory: must not be negative, got '-1'"),
        ({"resources": {"worker": {"cpu": "-1e3", "memory": "1Gi"}}}, "resources.worker.cpu: must not be negative, got '-1e3'"),
        ({"resources": {"launcher": {"cpu": "-1m", "memory": "1Gi"}}}, "resources.launcher.cpu: must not be negative, got '-1m'"),
        ({"shmSize": "-1Gi"}, "shmSize: must not be negative, got '-1Gi'"),
        ({"runPolicy": {"schedulingPolicy": {"minResources": {"cpu": "-2"}}}},
         "runPolicy.schedulingPolicy.minResources.cpu: must not be negative, got '-2'"),
        # int32 in the MPIJob CRD: the field's own bound, not a rule that derives from it (metrics ports).
        ({"slotsPerWorker": 4294967297}, "slotsPerWorker: must be <= 2147483647, got 4294967297"),
        ({"workers": 99999999999999999999999}, "workers: must be <= 2147483647, got 99999999999999999999999"),
        ({"runPolicy": {"backoffLimit": 2**31}}, "runPolicy.backoffLimit: must be <= 2147483647, got 2147483648"),
        ({"runPolicy": {"schedulingPolicy": {"minAvailable": 2**31}}},
         "runPolicy.schedulingPolicy.minAvailable: must be <= 2147483647, got 2147483648"),
    ],
)  # fmt: skip
def test_rule_violations(fields: dict[str, Any], expected: str):
    assert errors_of(BASE | fields) == [expected]


def test_longest_valid_name_passes_and_one_more_fails():
    name = "a" * (63 - len("-worker-99"))
    assert load_spec(BASE | {"name": name, "workers": 100}).name == name
    assert errors_of(BASE | {"name": name + "a", "workers": 100}) == [
        f"name: pod hostname '{name}a-worker-99' is 64 characters; a DNS-1035 label has at most 63 (shorten the name)"
    ]


def test_quantities_and_counts_at_their_bounds_pass():
    assert load_spec(BASE | {"workers": 2**31 - 1}).workers == 2**31 - 1
    assert load_spec(BASE | {"slotsPerWorker": 2**31 - 1, "metrics": {"enabled": False}}).slots_per_worker == 2**31 - 1
    spec = load_spec(BASE | {"resources": {"worker": {"cpu": "-0", "memory": "+4Gi"}}, "shmSize": "0"})
    assert spec.run_policy.scheduling_policy.min_resources == {"cpu": "0", "memory": "8Gi"}  # type: ignore[union-attr]


def test_negative_quantities_are_field_errors_under_any_prefix():
    """A pipeline's candidate (and bench's job file) go through the same parse -> default -> validate."""
    bad = BASE | {"resources": {"worker": {"cpu": "1", "memory": "-1Gi"}}}
    assert messages(check_spec_data(bad, "candidates[0].job")[1]) == [
        "candidates[0].job.resources.worker.memory: must not be negative, got '-1Gi'"]


def test_many_errors_reported_together():
    """Parse errors (the refused field keeps its default) come first, then every rule's."""
    assert errors_of(BASE | {"workers": 0, "slotsPerWorker": -1, "nccl": {"debug": "x"}}) == [
        "nccl.debug: 'x' is not one of VERSION, WARN, INFO, TRACE",
        "workers: must be >= 1, got 0",
        "slotsPerWorker: must be >= 1, got -1",
    ]


def test_derived_fields_are_reported_only_when_the_fields_they_come_from_are_valid():
    """#28: minAvailable derived from workers: -2 is not the user's error to fix; workers is."""
    assert errors_of(BASE | {"workers": -2}) == ["workers: must be >= 1, got -2"]
    # A value the user wrote is always checked, and so is a derived one from valid fields.
    assert errors_of(BASE | {"workers": -2, "runPolicy": {"schedulingPolicy": {"minAvailable": 0}}}) == [
        "workers: must be >= 1, got -2", "runPolicy.schedulingPolicy.minAvailable: must be >= 1, got 0"]
    assert errors_of(BASE | {"resources": {"worker": {"cpu": "two", "memory": "1Gi"}}}) == [
        "resources.worker.cpu: 'two' is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)"]


def test_job_spec_validators_report_under_the_prefix_they_are_given():
    # One validator, two prefixes (a job file's top level, a pipeline's candidate): the same problems, and the
    # derived-value rule (minAvailable comes from workers) holds under either.
    bad = BASE | {"workers": -2, "workerz": 1, "sshPort": 0, "scheduling": {"tolerations": [{"value": "x"}]}}
    assert messages(check_spec_data(bad)[1]) == [
        "workerz: unknown field (did you mean 'workers'?)",
        "workers: must be >= 1, got -2",
        "scheduling.tolerations[0].operator: must be Exists when key is empty",
        "sshPort: 0 is not a port (1-65535)",
    ]
    assert messages(check_spec_data(bad, "candidates[1].job")[1]) == [
        "candidates[1].job.workerz: unknown field (did you mean 'workers'?)",
        "candidates[1].job.workers: must be >= 1, got -2",
        "candidates[1].job.scheduling.tolerations[0].operator: must be Exists when key is empty",
        "candidates[1].job.sshPort: 0 is not a port (1-65535)",
    ]
    spec, errors = check_spec_data(BASE, "candidates[1].job")
    assert (spec, errors) == (load_spec(BASE), [])


def test_the_operator_rules_report_under_the_prefix_they_are_given():
    manifest = render(load_spec(BASE))
    manifest["spec"]["slotsPerWorker"] = -1
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 0
    assert messages(check_manifest(manifest)) == [
        "spec.slotsPerWorker: must be >= 0, got -1", "spec.mpiReplicaSpecs[Worker].replicas: 0: must be >= 1"]
    assert messages(check_manifest(manifest, "items[2]")) == [
        "items[2].spec.slotsPerWorker: must be >= 0, got -1",
        "items[2].spec.mpiReplicaSpecs[Worker].replicas: 0: must be >= 1",
    ]


# ---- the operator's rules on MPIJob manifests ---------------------------------


def _manifest(**fields: Any) -> dict[str, Any]:
    return copy.deepcopy(render(load_spec(BASE | fields)))


def test_rendered_manifests_pass_the_operator_rules():
    for fields in ({}, {"gpu": True, "slotsPerWorker": 4}, {"elastic": {"minWorkers": 1, "maxWorkers": 3}}):
        assert check_manifest(render(load_spec(BASE | fields))) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=0),
         "spec.mpiReplicaSpecs[Worker].replicas: 0: must be >= 1"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2),
         "spec.mpiReplicaSpecs[Launcher].replicas: 2: must be 1"),
        (lambda m: m["spec"]["mpiReplicaSpecs"].pop("Launcher"),
         "spec.mpiReplicaSpecs[Launcher]: must have Launcher replica spec"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"),
         "spec.mpiReplicaSpecs[Worker].restartPolicy: 'Always' is not one of Never, OnFailure"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(containers=[]),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers: must define at least one container"),
        (lambda m: m["metadata"].update(name="x" * 60),
         f"metadata.name: pod hostname '{'x' * 60}-worker-1' is 69 characters; a DNS-1035 label has at most 63 (shorten the name)"),
        (lambda m: m["spec"]["runPolicy"].update(cleanPodPolicy="Never"),
         "spec.runPolicy.cleanPodPolicy: 'Never' is not one of None, Running, All"),
        (lambda m: m["spec"]["runPolicy"].update(backoffLimit=-2),
         "spec.runPolicy.backoffLimit: must be >= 0, got -2"),
        (lambda m: m["spec"].update(mpiImplementation="LAM"),
         "spec.mpiImplementation: 'LAM' is not one of OpenMPI, Intel, MPICH"),
        (lambda m: m["spec"].update(sshAuthMountPath=""),
         "spec.sshAuthMountPath: must have a mount path for SSH credentials"),
        (lambda m: m["spec"].update(slotPerWorker=2),
         "spec.slotPerWorker: unknown field (known: launcherCreationPolicy, mpiImplementation, mpiReplicaSpecs, "
         "runLauncherAsWorker, runPolicy, slotsPerWorker, sshAuthMountPath)"),
        (lambda m: m["spec"].update(slotsPerWorker=2),
         "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: mpirun -np 2, "
         "but (Worker replicas) x slotsPerWorker = 4"),
        (lambda m: m["spec"].update(slotsPerWorker=0),
         "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: mpirun -np 2, "
         "but slotsPerWorker = 0: the operator's hostfile offers no slots"),
        (lambda m: m["spec"].update(runLauncherAsWorker=True),
         "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: mpirun -np 2, "
         "but (Worker replicas + the launcher) x slotsPerWorker = 3"),
        (lambda m: m["spec"]["runPolicy"].update(managedBy="example.com/my-controller"),
         "spec.runPolicy.managedBy: 'example.com/my-controller' is not one of kubeflow.org/mpi-operator, "
         "kueue.x-k8s.io/multikueue"),
        # Wrongly typed fields (the CRD's types): one field error each, before any rule reads them.
        (lambda m: m.update(metadata="x"), "metadata: must be a mapping, got string 'x'"),
        (lambda m: m.update(metadata=None),
         "metadata.name: required (the pods' hostnames are <name>-worker-<i>)"),
        (lambda m: m["metadata"].update(name=5), "metadata.name: must be a string, got number 5"),
        (lambda m: m["metadata"].update(labels="x"), "metadata.labels: must be a mapping, got string 'x'"),
        (lambda m: m["spec"].update(slotsPerWorker="two"), "spec.slotsPerWorker: must be an integer, got string 'two'"),
        (lambda m: m["spec"].update(runPolicy="x"), "spec.runPolicy: must be a mapping, got string 'x'"),
        (lambda m: m["spec"]["runPolicy"].update(schedulingPolicy="x"),
         "spec.runPolicy.schedulingPolicy: must be a mapping, got string 'x'"),
        (lambda m: m["spec"].update(mpiReplicaSpecs=[]), "spec.mpiReplicaSpecs: must be a mapping, got a list"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"].update(template="x"),
         "spec.mpiReplicaSpecs[Worker].template: must be a mapping, got string 'x'"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=10**30),
         "spec.mpiReplicaSpecs[Worker].replicas: 1000000000000000000000000000000 is out of range for an int32 "
         "(-2147483648..2147483647)"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(containers="x"),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers: must be a list, got string 'x'"),
        (lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"].__setitem__(0, "x"),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers[0]: must be a mapping, got string 'x'"),
        (lambda m: worker_pod(m)["containers"][0].update(resources="x"),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers[0].resources: must be a mapping, got string 'x'"),
        (lambda m: worker_pod(m)["containers"][0]["resources"].update(limits="x"),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers[0].resources.limits: must be a mapping, "
         "got string 'x'"),
        (lambda m: worker_pod(m)["containers"][0]["resources"]["limits"].update(memory="-1Gi"),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers[0].resources.limits.memory: must not be "
         "negative, got '-1Gi'"),
        (lambda m: worker_pod(m)["containers"][0]["resources"]["requests"].update(cpu=0.5),
         "spec.mpiReplicaSpecs[Worker].template.spec.containers[0].resources.requests.cpu: must be a Kubernetes "
         "quantity (a string or an integer), got number 0.5"),
        (lambda m: launcher(m).update(command="python x"),
         "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: must be a list, "
         "got string 'python x'"),
        (lambda m: launcher(m).update(args=[1]),
         "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].args[0]: must be a string, got number 1"),
        (lambda m: worker_pod(m).update(volumes="x"),
         "spec.mpiReplicaSpecs[Worker].template.spec.volumes: must be a list, got string 'x'"),
    ],
)  # fmt: skip
def test_manifest_rule_violations(edit, expected: str):
    manifest = _manifest()
    edit(manifest)
    assert messages(check_manifest(manifest)) == [expected]


def test_the_manifest_shape_check_types_fields_as_the_mpijob_crd_does():
    """The package carries the types it checks (render never reads ../shared); they are the real CRD's."""
    from hvdk8s.mpijob.validation import _MPIJOB_SHAPE

    from kube_double import crd_schema

    def compare(shape: Any, crd: dict[str, Any], path: str) -> int:
        if isinstance(shape, dict):
            assert crd["type"] == "object", path
            if "properties" not in crd and "additionalProperties" not in crd:
                return 0  # the MPIJob's own metadata: ObjectMeta, the API server's
            if wild := {"*", "[*]"} & set(shape):
                return compare(shape[wild.pop()], crd["additionalProperties"], f"{path}.*")
            return sum(compare(inner, crd["properties"][key], f"{path}.{key}") for key, inner in shape.items())
        if isinstance(shape, list):
            assert crd["type"] == "array", path
            return compare(shape[0], crd["items"], f"{path}[]")
        if shape == "quantity":
            assert crd.get("x-kubernetes-int-or-string") and "pattern" in crd, path
        elif shape in ("int32", "int64"):
            assert (crd["type"], crd.get("format")) == ("integer", shape), path
        else:
            assert crd["type"] == shape, path
        return 1

    assert compare(_MPIJOB_SHAPE, crd_schema(), "") > 30  # leaves compared (crd_schema skips without ../shared)


def test_operator_defaulting_before_validation():
    """Fields the operator defaults may be absent from a hand-written MPIJob."""
    manifest = _manifest()
    for key in ("slotsPerWorker", "sshAuthMountPath", "mpiImplementation", "launcherCreationPolicy", "runPolicy"):
        del manifest["spec"][key]
    for replica in manifest["spec"]["mpiReplicaSpecs"].values():
        del replica["restartPolicy"]
    del manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"]
    assert messages(check_manifest(manifest)) == []


def test_launcher_only_mpijob_is_accepted_like_the_operator_does():
    """No Worker replica: the operator runs it (its hostfile is empty), so hvdk8s must not refuse it."""
    manifest = _manifest()
    del manifest["spec"]["mpiReplicaSpecs"]["Worker"]
    assert check_manifest(manifest) == []
    manifest["spec"]["runLauncherAsWorker"] = True  # the hostfile lists the launcher: -np fills its slots
    command = launcher(manifest)["command"]
    command[command.index("-np") + 1] = "1"
    assert check_manifest(manifest) == []


def test_run_launcher_as_worker_counts_the_launchers_slots():
    manifest = render(load_spec(BASE | {"runLauncherAsWorker": True, "slotsPerWorker": 2, "gpu": True}))
    assert manifest["spec"]["runLauncherAsWorker"] is True
    assert mpirun_of(launcher(manifest))[:3] == ["mpirun", "-np", "6"]  # (2 workers + launcher) x 2
    assert launcher(manifest)["resources"]["limits"]["nvidia.com/gpu"] == 2  # it runs ranks: worker-sized
    assert check_manifest(manifest) == []
    alone = render(load_spec(BASE | {"runLauncherAsWorker": True, "workers": 0}))
    assert list(alone["spec"]["mpiReplicaSpecs"]) == ["Launcher"]
    assert launcher(alone)["command"][:3] == ["mpirun", "-np", "1"]  # no worker to wait for
    assert check_manifest(alone) == []
    assert errors_of(BASE | {"workers": 0}) == ["workers: must be >= 1, got 0"]


def test_gpus_other_than_slots_in_a_ready_made_mpijob_warn_but_pass(tmp_path: Path):
    manifest = _manifest(gpu=True)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] = 2
    assert check_manifest(manifest) == []  # the operator allows it
    path = tmp_path / "m.yaml"
    path.write_text(to_yaml(manifest))
    warnings: list[str] = []
    assert manifest_from_file(path, warn=warnings.append) == manifest
    assert warnings == [f"hvdk8s: warning: {path}: spec.mpiReplicaSpecs[Worker].template.spec.containers[0]."
                        "resources.limits.nvidia.com/gpu: 2 GPUs per worker, but slotsPerWorker = 1: hvdk8s "
                        "renders one rank per GPU"]


def test_manifest_from_file(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(BASE))
    rendered = manifest_from_file(job)
    assert rendered == render(load_spec(BASE))
    as_is = tmp_path / "mpijob.yaml"
    hand_edited = copy.deepcopy(rendered)
    hand_edited["metadata"]["annotations"] = {"note": "kept"}
    as_is.write_text(to_yaml(hand_edited))
    assert manifest_from_file(as_is) == hand_edited
    hand_edited["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 0
    as_is.write_text(to_yaml(hand_edited))
    with pytest.raises(SpecError) as info:
        manifest_from_file(as_is)
    assert info.value.errors == ["spec.mpiReplicaSpecs[Worker].replicas: 0: must be >= 1"]


# ---- elastic ----------------------------------------------------------------


def test_elastic_launcher_command_and_bounds():
    manifest = render(load_spec(BASE | {"workers": 3, "slotsPerWorker": 2, "elastic": {"minWorkers": 2, "maxWorkers": 5}}))
    assert launcher(manifest)["command"] == [
        # a failed host (a deleted pod, re-created under its name) may rejoin after its cooldown
        "horovodrun", "--blacklist-cooldown-range", "10", "300",
        "-np", "6", "--min-np", "4", "--max-np", "10", "--slots", "2",
        "--host-discovery-script", "python -m hvdk8s.launcher.hosts ready --port 2222 -- /etc/mpi/discover_hosts.sh",
        "python", "/app/examples/train_digits.py",
    ]  # fmt: skip
    assert manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert messages(check_manifest(manifest)) == []
    assert errors_of(BASE | {"workers": 6, "elastic": {"minWorkers": 2, "maxWorkers": 5}}) == [
        "workers: must be between elastic.minWorkers (2) and elastic.maxWorkers (5)"
    ]
    assert errors_of(BASE | {"elastic": {"minWorkers": 3, "maxWorkers": 2}}) == [
        "elastic.maxWorkers: must be >= elastic.minWorkers (3)"
    ]
    assert errors_of(BASE | {"workers": 1, "elastic": {"minWorkers": 0, "maxWorkers": 2}}) == [
        "elastic.minWorkers: must be >= 1, got 0"
    ]
    # hostnames are checked for the largest worker index the job can scale to
    name = "a" * (63 - len("-worker-99"))
    assert errors_of(BASE | {"name": name, "elastic": {"minWorkers": 1, "maxWorkers": 101}}) == [
        f"name: pod hostname '{name}-worker-100' is 64 characters; a DNS-1035 label has at most 63 (shorten the name)"
    ]


# ---- metrics -----------------------------------------------------------------


def test_metrics_wiring_per_local_rank():
    manifest = render(load_spec(BASE | {"slotsPerWorker": 3, "metrics": {"port": 9400, "path": "/prom"}}))
    template = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    container = template["spec"]["containers"][0]
    assert container["ports"] == [
        {"name": "ssh", "containerPort": 2222},
        {"name": "metrics-0", "containerPort": 9400},
        {"name": "metrics-1", "containerPort": 9401},
        {"name": "metrics-2", "containerPort": 9402},
    ]
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/prom"}  # fmt: skip
    for c in (container, launcher(manifest)):
        env = {e["name"]: e["value"] for e in c["env"]}
        assert (env["HVDK8S_METRICS_PORT"], env["HVDK8S_JOB_NAME"]) == ("9400", "digits")
    assert "HVDK8S_METRICS_PORT" in launcher(manifest)["command"]  # forwarded to every rank

    off = render(load_spec(BASE | {"metrics": {"enabled": False}}))
    template = off["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    assert "annotations" not in template["metadata"]
    assert template["spec"]["containers"][0]["ports"] == [{"name": "ssh", "containerPort": 2222}]
    assert "HVDK8S_METRICS_PORT" not in launcher(off)["command"]


def test_user_env_is_set_and_forwarded():
    manifest = render(load_spec(BASE | {"env": {"DATA_DIR": "/shared/data", "TF_CPP_MIN_LOG_LEVEL": "0"}}))
    command = launcher(manifest)["command"]
    names = [command[i + 1] for i, arg in enumerate(command) if arg == "-x"]
    assert names == sorted([*FORWARDED, "DATA_DIR"])
    assert launcher(manifest)["env"][-2:] == [{"name": "DATA_DIR", "value": "/shared/data"},
                                              {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "0"}]  # fmt: skip


@pytest.mark.parametrize(("env", "level"), [({}, "2"), ({"TF_CPP_MIN_LOG_LEVEL": "1"}, "1"), ({"HVDK8S_VERBOSE": "1"}, None)])
def test_every_pod_is_quiet_as_an_hvdk8s_command_unless_the_job_file_says_otherwise(env, level):
    """TensorFlow's start-up lines off in every pod (``hvdk8s.common.quiet``'s level), as the CLI's own ranks; the job
    file's ``env`` may set the level, or HVDK8S_VERBOSE for TensorFlow's default."""
    manifest = render(load_spec(BASE | {"env": env}))
    for container in (launcher(manifest), worker_pod(manifest)["containers"][0]):
        assert {e["name"]: e["value"] for e in container["env"]}.get("TF_CPP_MIN_LOG_LEVEL") == level


def test_shm_can_be_turned_off():
    pod = worker_pod(render(load_spec(BASE | {"shmSize": None})))
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]


# ---- CLI ----------------------------------------------------------------------


def test_render_from_flags_only(capsys: pytest.CaptureFixture[str]):
    assert run_render("--name", "quick", "--image", "img:2", "--workers", "3", "--slots", "2", "--gpu",
                      "--", "python", "train.py", "--epochs", "1") == 0  # fmt: skip
    manifest = yaml.safe_load(capsys.readouterr().out)
    assert manifest == render(load_spec({"name": "quick", "image": "img:2", "workers": 3, "slotsPerWorker": 2,
                                         "gpu": True, "command": ["python", "train.py", "--epochs", "1"]}))  # fmt: skip


def test_render_flags_override_file_and_podmonitor(capsys: pytest.CaptureFixture[str]):
    assert run_render(str(EXAMPLES / "cpu.yaml"), "--workers", "4", "--podmonitor") == 0
    job, monitor = yaml.safe_load_all(capsys.readouterr().out)
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
    assert mpirun_of(launcher(job))[:3] == ["mpirun", "-np", "4"]
    assert monitor["kind"] == "PodMonitor" and monitor["metadata"]["name"] == "digits-cpu"


def test_render_errors_are_user_errors(tmp_path: Path):
    with pytest.raises(UserError, match="give JOB.yaml, or --name, --image"):
        run_render("--name", "x")
    with pytest.raises(SpecError) as info:
        run_render("--name", "x", "--image", "i", "--workers", "0", "--", "python", "t.py")
    assert str(info.value) == "command line: invalid:\n  workers: must be >= 1, got 0"
    mpijob = tmp_path / "m.yaml"
    mpijob.write_text((EXAMPLES / "cpu.mpijob.yaml").read_text())
    with pytest.raises(UserError, match="flags cannot change it"):
        run_render(str(mpijob), "--workers", "3")
    with pytest.raises(UserError, match="--podmonitor needs a job spec"):
        run_render(str(mpijob), "--podmonitor")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match="-o .*/a-file/out.yaml: Not a directory"):
        run_render(str(EXAMPLES / "cpu.yaml"), "-o", str(tmp_path / "a-file" / "out.yaml"))
    assert run_render(str(EXAMPLES / "cpu.yaml"), "-o", str(tmp_path / "new" / "out.yaml")) == 0  # folders are made
    assert (tmp_path / "new" / "out.yaml").read_text() == (EXAMPLES / "cpu.mpijob.yaml").read_text()


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda m: m.update(metadata="x"), "metadata: must be a mapping, got string 'x'"),
    (lambda m: m["spec"].update(runPolicy="x"), "spec.runPolicy: must be a mapping, got string 'x'"),
    (lambda m: launcher(m).update(command="python x"),
     "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: must be a list, got string 'python x'"),
    (lambda m: m.update(kind="x") or m.clear() or m.update(BASE, resources={"worker": {"cpu": "1", "memory": "-1Gi"}}),
     "resources.worker.memory: must not be negative, got '-1Gi'"),
])  # fmt: skip
def test_render_and_submit_refuse_malformed_files_with_a_field_path(edit, expected, tmp_path: Path, capsys):
    """Exit 2 and the field's path, never a traceback: a ready-made MPIJob or a job spec (the last row)."""
    from hvdk8s.cli import main
    from hvdk8s.mpijob import objects_from_file

    data = yaml.safe_load((EXAMPLES / "cpu.mpijob.yaml").read_text())
    edit(data)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["render", str(path)]) == 2
    assert capsys.readouterr().err == f"hvdk8s render: error: {path}: invalid:\n  {expected}\n"
    with pytest.raises(SpecError) as info:  # what submit sends
        objects_from_file(path)
    assert info.value.errors == [expected]


def test_render_passes_mpijob_files_through(capsys: pytest.CaptureFixture[str]):
    assert run_render(str(EXAMPLES / "gpu.mpijob.yaml")) == 0
    assert capsys.readouterr().out == (EXAMPLES / "gpu.mpijob.yaml").read_text()


def test_to_yaml_is_stable_and_alias_free():
    spec = load_spec(BASE)
    text = to_yaml(render(spec))
    assert text == to_yaml(render(load_spec(BASE)))
    assert "&id" not in text and "*id" not in text
    assert text.splitlines()[:3] == ["apiVersion: kubeflow.org/v2beta1", "kind: MPIJob", "metadata:"]
    assert to_yaml({"a": 1}, {"b": 2}) == "a: 1\n---\nb: 2\n"


# ---- Open MPI's settings (the launcher command run for real: test_mpijob_launch) ----


def test_open_mpi_settings_become_mpiruns_parameters_and_are_checked():
    spec = load_spec({**BASE, "openMpi": {"allreduceAlgorithm": "recursive_doubling", "yieldWhenIdle": False,
                                          "tcpEagerLimit": 65536, "mca": {"btl_tcp_if_include": "eth0"}}})  # fmt: skip
    argv = launcher(render(spec))["command"]
    start = argv.index("^openib") + 1
    assert argv[start:argv.index("-x")] == [
        "-mca", "btl_tcp_eager_limit", "65536", "-mca", "btl_tcp_if_include", "eth0",
        "-mca", "btl_tcp_max_send_size", "131072", "-mca", "btl_tcp_rndv_eager_limit", "65536",
        "-mca", "coll_tuned_allreduce_algorithm", "recursive_doubling",
        "-mca", "coll_tuned_use_dynamic_rules", "1", "-mca", "mpi_yield_when_idle", "0",
    ]  # fmt: skip
    argv = launcher(render(load_spec({**BASE, "openMpi": {"mca": {"coll_tuned_bcast_algorithm": "6"}}})))["command"]
    assert argv[argv.index("coll_tuned_use_dynamic_rules") + 1] == "1"  # or Open MPI ignores the bcast choice
    assert errors_of({**BASE, "openMpi": {"tcpEagerLimit": 4096, "mca": {
        "pml": "ucx", "Bad-Name": "x", "btl_tcp_links": " ", "coll_tuned_allreduce_algorithm": "4",
        "btl_tcp_eager_limit": "1048576"}}}) == [  # fmt: skip
        "openMpi.mca.pml: hvdk8s launches over ob1 (TCP), the transport every container network has",
        "openMpi.mca.Bad-Name: not an Open MPI parameter name (lowercase letters, digits and _)",
        "openMpi.mca.btl_tcp_links: empty value",
        "openMpi.mca.coll_tuned_allreduce_algorithm: set it with openMpi.allreduceAlgorithm",
        "openMpi.mca.btl_tcp_eager_limit: set it with openMpi.tcpEagerLimit",
        "openMpi.tcpEagerLimit: 4096: must be between 65536 (Open MPI's default) and 1073741824 bytes",
    ]
    assert errors_of({**BASE, "openMpi": {"tcpEagerLimit": 2 << 30}}) == [
        "openMpi.tcpEagerLimit: 2147483648: must be between 65536 (Open MPI's default) and 1073741824 bytes"
    ]
    assert errors_of({**BASE, "env": {"OMPI_MCA_mpi_yield_when_idle": "0", "OMPI_MCA_plm_rsh_args": "-p 22",
                                      "OMPI_MCA_btl_tcp_links": "2"}}) == [  # fmt: skip
        "env.OMPI_MCA_mpi_yield_when_idle: set it with openMpi.yieldWhenIdle",
        "env.OMPI_MCA_plm_rsh_args: set by the MPI Operator (how the launcher reaches the workers' sshd)",
    ]
    assert errors_of({**BASE, "elastic": {"minWorkers": 1, "maxWorkers": 2}, "openMpi": {"allreduceAlgorithm": "ring"}}) == [
        "openMpi: not with elastic: elastic jobs run horovodrun over Gloo, not mpirun"
    ]
    with pytest.raises(UserError, match="openMpi.allreduceAlgorithm: 'tree' is not one of auto, basic_linear"):
        load_spec({**BASE, "openMpi": {"allreduceAlgorithm": "tree"}})


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="Open MPI not installed")
def test_open_mpi_takes_every_allreduce_algorithm_name_the_spec_allows():
    """Open MPI reads an unknown name as a warning and its default: each name must come back as set."""
    for algorithm in typing.get_args(AllreduceAlgorithm)[1:]:  # all but auto, which sets nothing
        env = os.environ | {"OMPI_MCA_coll_tuned_allreduce_algorithm": algorithm}
        shown = subprocess.run(["ompi_info", "--param", "coll", "tuned", "--level", "9"], env=env,
                               capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        assert f'"coll_tuned_allreduce_algorithm" (current value: "{algorithm}"' in shown.stdout, algorithm
        assert "invalid value" not in shown.stdout + shown.stderr


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="Open MPI not installed")
def test_open_mpi_takes_the_tcp_eager_settings_hvdk8s_sets():
    """The three TCP sizes are Open MPI 4.1's parameter names, and it reads hvdk8s's values for them from the
    environment, where mpirun's -mca puts them (what the transport then does with them, the benchmark measures)."""
    mca = tcp_eager_mca(DEFAULT_TCP_EAGER_LIMIT)
    env = os.environ | {f"OMPI_MCA_{name}": value for name, value in mca.items()}
    shown = subprocess.run(["ompi_info", "--param", "btl", "tcp", "--level", "9"], env=env,
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    for name, value in mca.items():
        assert f'"{name}" (current value: "{value}", data source: environment' in shown.stdout, name


def test_names_ending_in_a_newline_are_rejected():
    """A YAML block scalar (`name: |`) ends in a newline; `$` alone would let it through."""
    with pytest.raises(UserError, match="name"):
        load_spec(BASE | {"name": "digits\n"})


def test_horovod_knobs_become_horovods_variables_and_are_checked():
    manifest = render(load_spec({**BASE, "horovod": {"cycleTimeMs": 0.5, "cacheCapacity": 0, "autotune": True}}))
    env = {e["name"]: e["value"] for e in launcher(manifest)["env"]}
    assert (env["HOROVOD_CYCLE_TIME"], env["HOROVOD_CACHE_CAPACITY"], env["HOROVOD_AUTOTUNE"]) == ("0.5", "0", "1")
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(128 * 1024 * 1024)  # Horovod's own default
    assert errors_of({**BASE, "horovod": {"cycleTimeMs": 0, "cacheCapacity": -1}}) == [
        "horovod.cycleTimeMs: must be > 0 (milliseconds), got 0",
        "horovod.cacheCapacity: must be >= 0, got -1",
    ]
    assert errors_of({**BASE, "horovod": {"cycleTimeMs": "fast"}}) == ["horovod.cycleTimeMs: must be a number, got string 'fast'"]
