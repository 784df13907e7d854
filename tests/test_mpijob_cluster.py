"""What a shared cluster needs from a rendered job: gang scheduling that can be
satisfied, Kueue/suspension/managedBy combinations that run, every pod setting a
platform team sets, Ready-only elastic hosts, and Kubeflow Trainer TrainJobs
validated against the real Trainer CRDs (``../shared/schemas``)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvdk8s.launcher.hosts import private_identity
from hvdk8s.mpijob import SpecError, check_manifest, load_spec, objects_from_file, render, render_trainjob
from hvdk8s.mpijob.render import launcher_command
from hvdk8s.mpijob.trainjob import ANCESTOR_LABEL, checked_render_trainjob

from conftest import shared
from test_mpijob import BASE, errors_of, launcher, mpirun_of, run_render, worker_pod
from test_mpijob_schema import crd_errors, pod_errors, strict_validator, template_errors

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[1] / "mpijob" / "examples"


def pods(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["template"] for r in manifest["spec"]["mpiReplicaSpecs"].values()]


# ---- gang scheduling (mpi-operator issue 608) ----------------------------------


def test_min_available_counts_the_pods_that_exist_together():
    def min_available(**fields: Any) -> int:
        return render(load_spec(BASE | fields))["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"]

    assert min_available(workers=4) == 4  # WaitForWorkersReady: the launcher comes after them
    assert min_available(workers=4, launcherCreationPolicy="AtStartup") == 5
    assert min_available(workers=3, elastic={"minWorkers": 2, "maxWorkers": 5}) == 2
    assert min_available(workers=0, runLauncherAsWorker=True) == 1
    gang = {"runPolicy": {"schedulingPolicy": {"minAvailable": 3, "queue": "q"}}}
    assert min_available(**gang, launcherCreationPolicy="AtStartup") == 3  # explicit and reachable: kept


def test_a_gang_that_can_never_fill_is_refused_with_the_reason():
    (error,) = errors_of(BASE | {"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}})
    assert error.startswith("runPolicy.schedulingPolicy.minAvailable: 3 counts the launcher, but "
                            "launcherCreationPolicy: WaitForWorkersReady creates it only once the workers run")
    assert "mpi-operator issue 608" in error and "Use at most 2, or launcherCreationPolicy: AtStartup" in error
    assert errors_of(BASE | {"runPolicy": {"schedulingPolicy": {"minAvailable": 4}}}) == [
        "runPolicy.schedulingPolicy.minAvailable: 4 is more than the job's pods (2 workers + launcher)"]


# ---- Kueue, suspension, managedBy --------------------------------------------------


def test_queue_label_and_a_launcher_that_waits_for_its_workers_itself():
    manifest = render(load_spec(EXAMPLES / "kueue.yaml"))
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    # Kueue creates it suspended: WaitForWorkersReady would not hold (issue 615), so AtStartup ...
    assert manifest["spec"]["launcherCreationPolicy"] == "AtStartup"
    assert manifest["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3}
    # ... and the launcher waits for every worker's sshd before mpirun
    command = launcher(manifest)["command"]
    assert command[:9] == ["python", "-m", "hvdk8s.launcher.hosts", "wait", "--port", "2222",
                           "--timeout", "3600", "--"]
    assert command[9:12] == ["mpirun", "-np", "2"]
    assert check_manifest(manifest) == []
    broken = dict(manifest, spec=dict(manifest["spec"]))
    broken["spec"]["slotsPerWorker"] = 2
    assert [str(e) for e in check_manifest(broken)] == [  # the -np rule finds mpirun behind the wrapper
        "spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: mpirun -np 2, "
        "but (Worker replicas) x slotsPerWorker = 4"]


@pytest.mark.parametrize(("fields", "expected"), [
    ({"queue": "q", "launcherCreationPolicy": "WaitForWorkersReady"},
     "launcherCreationPolicy: WaitForWorkersReady does not hold with queue (Kueue creates it suspended)"),
    ({"runPolicy": {"suspend": True}, "launcherCreationPolicy": "WaitForWorkersReady"},
     "launcherCreationPolicy: WaitForWorkersReady does not hold with runPolicy.suspend: true"),
    ({"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}},
     "queue: runPolicy.managedBy: kueue.x-k8s.io/multikueue hands the job to MultiKueue"),
    ({"runPolicy": {"managedBy": "example.com/mine"}},
     "runPolicy.managedBy: 'example.com/mine' is not one of kubeflow.org/mpi-operator, kueue.x-k8s.io/multikueue"),
    ({"labels": {"team": "a b"}}, "labels.team: 'a b' is not a label value"),
    ({"podAnnotations": {"bad key!": "x"}}, "podAnnotations.bad key!: 'bad key!' is not a label key"),
    ({"capabilities": ["ipc_lock"]}, "capabilities[0]: 'ipc_lock' is not a Linux capability name"),
    ({"resources": {"worker": {"cpu": "1", "memory": "1Gi", "extra": {"nvidia.com/gpu": 1}}}},
     "resources.worker.extra.nvidia.com/gpu: set GPUs with gpu: true and slotsPerWorker"),
    ({"affinity": {"nodeAfinity": {}}}, "affinity.nodeAfinity: unknown field"),
    ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "topologySpreadConstraints[0]: needs maxSkew, topologyKey"),
])  # fmt: skip
def test_combinations_that_never_run_are_refused(fields: dict[str, Any], expected: str):
    (error,) = errors_of(BASE | fields)
    assert error.startswith(expected)


def test_suspend_and_multikueue_render_as_written():
    manifest = render(load_spec(BASE | {"queue": "q", "runPolicy": {"suspend": True,
                                                                    "managedBy": "kueue.x-k8s.io/multikueue"}}))
    run_policy = manifest["spec"]["runPolicy"]
    assert (run_policy["suspend"], run_policy["managedBy"]) == (True, "kueue.x-k8s.io/multikueue")
    assert check_manifest(manifest) == [] and crd_errors(manifest) == []


# ---- every pod setting ------------------------------------------------------------------


def test_pod_settings_reach_the_pods_they_are_for():
    manifest = render(load_spec(EXAMPLES / "kueue.yaml"))
    assert manifest["metadata"]["annotations"] == {"owner": "alice@example.com"}
    for template in pods(manifest):
        assert template["metadata"]["labels"]["cost-center"] == "ml-research"
        assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
        assert template["spec"]["serviceAccountName"] == "training"
        assert template["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
    istio_on = render(load_spec(BASE | {"labels": {"sidecar.istio.io/inject": "true"}, "podAnnotations": {"a": "b"}}))
    assert all(t["metadata"]["labels"]["sidecar.istio.io/inject"] == "true" for t in pods(istio_on))
    assert errors_of(BASE | {"podAnnotations": {"sidecar.istio.io/inject": "true"}}) == [
        "podAnnotations.sidecar.istio.io/inject: set it as labels.sidecar.istio.io/inject: Istio reads the label "
        "(the annotation is deprecated), and hvdk8s's default label would win over it"]

    volcano = render(load_spec(EXAMPLES / "volcano.yaml"))
    for template in pods(volcano):
        assert template["spec"]["schedulerName"] == "volcano"
        assert {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"} in (
            template["spec"]["tolerations"])  # the launcher too: it must land on the tainted pool
    assert worker_pod(volcano)["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert "topologySpreadConstraints" not in volcano["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]

    rdma = worker_pod(render(load_spec(EXAMPLES / "rdma.yaml")))
    container = rdma["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "64", "memory": "512Gi", "rdma/hca_shared_devices_a": "1",
                                                "hugepages-2Mi": "2Gi", "nvidia.com/gpu": 8}
    assert container["resources"]["requests"]["rdma/hca_shared_devices_a"] == "1"
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert (rdma["hostNetwork"], rdma["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "nodeAffinity" in rdma["affinity"]


@pytest.mark.parametrize("name", ["kueue", "volcano", "rdma"])
def test_new_examples_fit_crd_pod_schema_and_operator_rules(name: str):
    manifest = yaml.safe_load((EXAMPLES / f"{name}.mpijob.yaml").read_text())
    assert pod_errors(manifest) == [] and check_manifest(manifest) == [] and crd_errors(manifest) == []


def test_broken_pod_objects_fail_the_pod_schema():
    """affinity/topologySpreadConstraints are checked by the pod schema: the check can fail."""
    manifest = render(load_spec(BASE | {"affinity": {"nodeAffinity": {"required": {}}},
                                        "topologySpreadConstraints": [{"maxSkew": "one", "topologyKey": "k",
                                                                       "whenUnsatisfiable": "DoNotSchedule"}]}))
    assert pod_errors(manifest) and crd_errors(manifest)


# ---- Ready-only hosts (launcher/hosts.py) ------------------------------------------------


@pytest.fixture
def listening() -> Any:
    """A port that accepts connections on 127.0.0.1 but not on 127.0.0.2."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def hosts_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hvdk8s.launcher.hosts", *argv], capture_output=True, text=True,
                          timeout=60)


def test_discovery_lists_only_hosts_whose_sshd_answers(listening: int, tmp_path: Path):
    script = tmp_path / "discover_hosts.sh"  # what the operator writes: every Running worker
    script.write_text("#!/bin/sh\necho 127.0.0.2\necho 127.0.0.1\n")
    script.chmod(0o755)
    listed = hosts_cli("ready", "--port", str(listening), "--", str(script))
    assert (listed.returncode, listed.stdout) == (0, "127.0.0.1\n")


def test_wait_runs_the_command_once_hosts_answer_and_gives_up_otherwise(listening: int, tmp_path: Path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"127.0.0.1 slots=1\n{socket.gethostname()}.job.ns.svc slots=1\n")  # itself: skipped
    ran = hosts_cli("wait", "--port", str(listening), "--hostfile", str(hostfile), "--", "echo", "mpirun-ran")
    assert (ran.returncode, ran.stdout) == (0, "mpirun-ran\n")
    hostfile.write_text("127.0.0.2 slots=1\n")
    gave_up = hosts_cli("wait", "--port", str(listening), "--hostfile", str(hostfile), "--timeout", "0.1",
                        "--", "echo", "mpirun-ran")
    assert gave_up.returncode == 1 and gave_up.stdout == ""
    assert f"these workers never answered on their sshd port {listening}: 127.0.0.2" in gave_up.stderr
    assert "raise workerWaitSeconds in the job file" in gave_up.stderr


def test_private_identity_gives_ssh_a_0600_copy_and_the_launcher_every_orted(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch):
    """The copy exists on the launcher only: Open MPI must not tree-spawn (orteds on node pods ssh-ing on to
    further pods with the same plm_rsh_args, where the copy's path does not exist)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    key = tmp_path / "id_rsa"
    key.write_bytes(b"PRIVATE KEY\n")
    key.chmod(0o640)  # as Trainer v2.3.0 mounts it
    env = private_identity(str(key), {"PATH": "/usr/bin", "OMPI_MCA_plm_rsh_args": "-p 2222"})
    copy = Path(env["OMPI_MCA_plm_rsh_args"].split()[-1])
    assert env == {"PATH": "/usr/bin", "OMPI_MCA_plm_rsh_args": f"-p 2222 -i {copy}",
                   "OMPI_MCA_plm_rsh_no_tree_spawn": "1"}
    assert copy.read_bytes() == b"PRIVATE KEY\n" and copy.stat().st_mode & 0o777 == 0o600
    assert copy.parent.parent == tmp_path and copy.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="Open MPI not installed")
def test_open_mpi_reads_the_no_tree_spawn_setting_from_the_environment(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    key = tmp_path / "id_rsa"
    key.write_bytes(b"")
    env = private_identity(str(key), dict(os.environ))
    shown = subprocess.run(["ompi_info", "--param", "plm", "rsh", "--level", "9"], env=env,
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert '"plm_rsh_no_tree_spawn" (current value: "true", data source: environment' in shown.stdout


# ---- Kubeflow Trainer v2 ------------------------------------------------------------------


@cache
def trainer_validator(file: str) -> Any:
    crd = yaml.safe_load(shared(f"schemas/{file}").read_text())
    return strict_validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def trainer_errors(obj: dict[str, Any]) -> list[str]:
    file = {"TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
            # TrainingRuntime's CRD differs only in scope (Trainer v2.3.0 manifests/base/crds)
            "TrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml"}[obj["kind"]]
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in trainer_validator(file).iter_errors(obj))


@pytest.mark.parametrize("name", ["cpu", "gpu", "kueue", "volcano", "rdma"])
def test_trainjob_and_runtime_fit_the_trainer_crds_and_pod_schema(name: str):
    runtime, job = render_trainjob(load_spec(EXAMPLES / f"{name}.yaml"))
    replicated = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert template_errors({r["name"]: r["template"]["spec"]["template"] for r in replicated}) == []
    assert trainer_errors(runtime) == [] and trainer_errors(job) == []


def test_trainjob_follows_trainers_mpi_conventions():
    spec = load_spec(EXAMPLES / "gpu.yaml")
    runtime, job = render_trainjob(spec)
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "mpi": {
        "numProcPerNode": 4, "mpiImplementation": "OpenMPI", "sshAuthMountPath": "/home/mpiuser/.ssh",
        "runLauncherAsNode": False}}  # fmt: skip
    node, launcher_job = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert (node["name"], launcher_job["name"]) == ("node", "launcher")
    assert launcher_job["dependsOn"] == [{"name": "node", "status": "Ready"}]
    assert launcher_job["template"]["metadata"]["labels"] == {ANCESTOR_LABEL: "trainer"}
    # every container is "node": the MPI plugin mounts the ssh keys and hostfile only there
    for rj in (node, launcher_job):
        assert rj["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"
    # the very mpirun command of the MPIJob path, behind a wait that gives ssh a 0600 copy of Trainer's 0640 key
    command = launcher_job["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == launcher_command(spec, ssh_identity="/home/mpiuser/.ssh/id_rsa")
    assert command[8:10] == ["--identity", "/home/mpiuser/.ssh/id_rsa"]
    assert mpirun_of({"command": command}) == mpirun_of(launcher(render(spec)))
    assert job["spec"] == {"runtimeRef": {"name": "hvdk8s-digits-gpu", "apiGroup": "trainer.kubeflow.org",
                                          "kind": "TrainingRuntime"},
                           "trainer": {"numNodes": 2, "numProcPerNode": 4}, "activeDeadlineSeconds": 86400}
    queued = render_trainjob(load_spec(EXAMPLES / "kueue.yaml"))[1]
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    as_node = render_trainjob(load_spec(BASE | {"runLauncherAsWorker": True}))
    assert as_node[0]["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] is True
    assert as_node[1]["spec"]["trainer"]["numNodes"] == 3  # Trainer counts the launcher among the nodes


@pytest.mark.parametrize("fields", [
    {"queue": "q", "launcherCreationPolicy": "WaitForWorkersReady"},
    {"runPolicy": {"suspend": True}, "launcherCreationPolicy": "WaitForWorkersReady"},
    {"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}},
], ids=["queue", "suspend", "minAvailable"])  # fmt: skip
def test_mpi_operator_only_rules_leave_a_trainjob_alone(fields: dict[str, Any], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]):
    """The MPI Operator's launcher creation under suspension (issue 615) and its PodGroup's minAvailable
    (issue 608) refuse these MPIJobs; render_trainjob sets its own launcherCreationPolicy and drops
    schedulingPolicy (JobSet's dependsOn waits for the nodes), so the same job file is a valid TrainJob."""
    assert errors_of(BASE | fields)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(BASE | fields))
    assert run_render(str(job_file), "--api", "trainjob") == 0
    rendered = list(yaml.safe_load_all(capsys.readouterr().out))
    assert rendered == objects_from_file(job_file, "trainjob")  # what submit --api trainjob sends
    runtime, job = rendered
    assert job["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == fields.get("queue")
    assert trainer_errors(runtime) == [] and trainer_errors(job) == []


def test_trainjob_refuses_what_trainer_cannot_express(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SpecError) as info:
        checked_render_trainjob(load_spec(EXAMPLES / "elastic.yaml"), "elastic.yaml")
    assert info.value.errors == ["elastic: Kubeflow Trainer's MPI plugin writes a fixed hostfile and has no elastic "
                                 "host discovery (no discover_hosts.sh): render an MPIJob (--api mpijob)"]
    assert run_render(str(EXAMPLES / "cpu.yaml"), "--api", "trainjob") == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["TrainingRuntime", "TrainJob"]
    assert run_render(str(EXAMPLES / "cpu.yaml")) == 0  # --api mpijob stays the default
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "MPIJob"
