"""Rendered objects run through models of the controllers that act on them (tests/controllers).

A schema says what an object may look like; these say what the MPI Operator
v0.8.2, Kubeflow Trainer v2.3.0 and Kueue v0.19.2 then do with it, as their
source does (each model cites file and function).
"""
from __future__ import annotations

import copy
from typing import Any

import pytest

from hvdk8s.launcher.hosts import hostfile_hosts
from hvdk8s.mpijob import SpecError, load_spec, render, render_trainjob
from hvdk8s.mpijob.trainjob import checked_render_trainjob

from controllers import kueue, mpi_operator, trainer
from test_mpijob import BASE, EXAMPLES, WAIT, errors_of, launcher, mpirun_of

pytestmark = pytest.mark.unit

ISTIO = "sidecar.istio.io/inject"


def mpijob_of(fields: dict[str, Any]) -> dict[str, Any]:
    manifest = render(load_spec(BASE | fields))
    manifest["metadata"]["namespace"] = "team-a"
    return manifest


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


# ---- MPI Operator --------------------------------------------------------------------------


def test_default_launcher_is_created_once_every_worker_is_ready_and_waits_anyway():
    manifest = mpijob_of({})
    assert mpi_operator.sync(manifest, ready_workers=1).launcher is None
    made = mpi_operator.sync(manifest, ready_workers=2)
    assert [p["metadata"]["name"] for p in made.workers] == ["digits-worker-0", "digits-worker-1"]
    assert container(made.launcher["template"])["command"][:len(WAIT)] == WAIT  # one connection each: cheap


@pytest.mark.parametrize("kueue_setting", [{"default_local_queue": True}, {"manage_jobs_without_queue_name": True}],
                         ids=["default-localqueue", "manageJobsWithoutQueueName"])
def test_a_job_kueue_suspends_without_a_queue_label_gets_a_launcher_that_waits(kueue_setting: dict[str, bool]):
    """#27 item 4: no ``queue:`` in the job file, yet Kueue suspends the MPIJob on create; the operator
    then creates the launcher at once and starts it together with the workers on admission."""
    stored = kueue.on_create(mpijob_of({}), **kueue_setting)
    assert mpi_operator.suspended(stored)
    suspended = mpi_operator.sync(stored, ready_workers=0)
    assert suspended.workers == [] and suspended.launcher["suspend"] is True
    resumed = mpi_operator.sync(kueue.admit(stored), ready_workers=0, launcher=suspended.launcher)
    assert resumed.launcher["suspend"] is False and len(resumed.workers) == 2  # none of them Ready yet
    # So the launcher must wait for the workers' sshd itself, on the hosts of the operator's hostfile.
    command = container(resumed.launcher["template"])["command"]
    assert command[:len(WAIT)] == WAIT and mpirun_of(container(resumed.launcher["template"]))[0] == "mpirun"
    assert hostfile_hosts(mpi_operator.hostfile(stored), "digits-launcher") == [
        "digits-worker-0.digits.team-a.svc", "digits-worker-1.digits.team-a.svc"]


def test_the_wait_reads_the_hostfile_the_operator_points_open_mpi_at():
    env = {e["name"]: e["value"] for e in container(mpi_operator.launcher_pod(mpijob_of({})))["env"]}
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    as_worker = mpijob_of({"runLauncherAsWorker": True, "workers": 1})
    text = mpi_operator.hostfile(as_worker)
    assert text.splitlines()[0] == "digits-launcher.digits.team-a.svc slots=1"
    assert hostfile_hosts(text, "digits-launcher") == ["digits-worker-0.digits.team-a.svc"]  # not itself


def test_the_wait_timeout_is_a_job_file_setting():
    command = launcher(render(load_spec(BASE | {"workerWaitSeconds": 7200})))["command"]
    assert command[len(WAIT):command.index("--")] == ["--port", "2222", "--timeout", "7200"]
    assert errors_of(BASE | {"workerWaitSeconds": 0}) == ["workerWaitSeconds: must be >= 1, got 0"]


def test_the_operator_mounts_roots_key_0600():
    pod = mpi_operator.launcher_pod(mpijob_of({}))
    assert mpi_operator.ssh_key_mode(pod["spec"]) == 0o600
    assert {"name": "ssh-auth", "mountPath": "/root/.ssh"} in container(pod)["volumeMounts"]


def test_ttl_reaches_the_launcher_job_only():
    """#27 item 10: the operator puts ttlSecondsAfterFinished on the launcher Job (newLauncherJob);
    the MPIJob, its Service, ConfigMap and Secret stay until deleted (``hvdk8s delete``)."""
    manifest = mpijob_of({})
    job = mpi_operator.launcher_job(manifest)
    assert (job["ttlSecondsAfterFinished"], job["backoffLimit"]) == (86400, 0)
    assert "ttlSecondsAfterFinished" not in mpi_operator.worker_pod(manifest, 0)["spec"]


# ---- Volcano through the operator's podgroup.go ---------------------------------------------


@pytest.mark.parametrize(("fields", "gang"), [
    ({"workers": 4, "resources": {"worker": {"cpu": "16", "memory": "64Gi"}}}, 4),
    ({"workers": 3, "queue": "q"}, 4),  # AtStartup: the launcher is in the gang
    ({"workers": 3, "elastic": {"minWorkers": 2, "maxWorkers": 4}}, 2),
])  # fmt: skip
def test_podgroup_reserves_what_the_gang_really_needs(fields: dict[str, Any], gang: int):
    """#27 item 8: with minAvailable = workers, calPGMinResource would reserve the launcher plus one
    worker fewer; hvdk8s renders minResources for the pods that really start together."""
    manifest = mpijob_of(fields)
    group = mpi_operator.podgroup(manifest)
    assert group["minMember"] == gang
    spec = manifest["spec"]["mpiReplicaSpecs"]
    worker = container(spec["Worker"]["template"])["resources"]["requests"]
    launcher_req = container(spec["Launcher"]["template"])["resources"]["requests"]
    with_launcher = manifest["spec"]["launcherCreationPolicy"] == "AtStartup"
    workers = gang - int(with_launcher)
    expected = {key: mpi_operator.quantity(worker[key]) * workers
                + (mpi_operator.quantity(launcher_req[key]) if with_launcher else 0) for key in worker}
    assert {k: mpi_operator.quantity(v) for k, v in group["minResources"].items()} == expected


def test_volcano_gets_no_schedule_timeout():
    """VolcanoCtrl.newPodGroup drops scheduleTimeoutSeconds (only scheduler-plugins reads it)."""
    fields = {"schedulerName": "volcano", "runPolicy": {"schedulingPolicy": {"scheduleTimeoutSeconds": 600}}}
    assert mpi_operator.podgroup(render(load_spec(BASE | {"workers": 2})), "volcano").keys() == {
        "minMember", "minResources"}
    assert errors_of(BASE | fields) == [
        "runPolicy.schedulingPolicy.scheduleTimeoutSeconds: Volcano ignores it (the MPI Operator's VolcanoCtrl "
        "does not pass it to the PodGroup; only the scheduler-plugins coscheduling gang reads it): remove it"]
    volcano = load_spec(EXAMPLES / "volcano.yaml")
    assert volcano.scheduler_name == "volcano" and volcano.run_policy.scheduling_policy.schedule_timeout_seconds is None


def test_every_pod_opts_out_of_istio_by_label():
    """#27 item 7: Istio reads the ``sidecar.istio.io/inject`` label; the annotation is deprecated."""
    manifest = mpijob_of({})
    made = mpi_operator.sync(manifest, ready_workers=2)
    for pod in [made.launcher["template"], *made.workers]:
        assert pod["metadata"]["labels"][ISTIO] == "false"
        assert ISTIO not in pod["metadata"].get("annotations", {})
    runtime, job = render_trainjob(load_spec(BASE))
    for pods in trainer.pods(job, runtime).values():
        assert all(p["metadata"]["labels"][ISTIO] == "false" for p in pods)
    opted_in = render(load_spec(BASE | {"labels": {ISTIO: "true"}}))
    assert launcher_pod_labels(opted_in)[ISTIO] == "true"


def launcher_pod_labels(manifest: dict[str, Any]) -> dict[str, str]:
    return manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"]["labels"]


# ---- Kubeflow Trainer ---------------------------------------------------------------------


def test_trainer_builds_the_nodes_hostfile_and_key_hvdk8s_expects():
    runtime, job = render_trainjob(load_spec(BASE | {"slotsPerWorker": 2}))
    pods = trainer.pods(job, runtime)
    assert [p["metadata"]["name"] for p in pods["node"]] == ["digits-node-0-0", "digits-node-0-1"]
    assert trainer.hostfile(job, runtime) == "digits-node-0-0.digits slots=2\ndigits-node-0-1.digits slots=2\n"
    (launcher_pod,) = pods["launcher"]
    # The key Trainer mounts (0640, refused by OpenSSH for root) is the one the wait copies to 0600.
    assert trainer.key_mode(launcher_pod) == 0o640
    assert not trainer.openssh_uses_key(trainer.key_mode(launcher_pod), key_uid=0, user_uid=0)
    command = container(launcher_pod)["command"]
    key = command[command.index("--identity") + 1]
    assert {"name": "mpi-ssh-auth", "mountPath": key.rsplit("/", 1)[0]} in container(launcher_pod)["volumeMounts"]
    assert mpirun_of(container(launcher_pod))[:3] == ["mpirun", "-np", "4"]  # fills the hostfile: 2 x 2
    env = {e["name"]: e["value"] for e in container(launcher_pod)["env"]}
    assert env["OMPI_MCA_orte_set_default_slots"] == "2"


def test_trainer_counts_the_launcher_as_a_node_when_it_runs_ranks():
    runtime, job = render_trainjob(load_spec(BASE | {"runLauncherAsWorker": True}))
    pods = trainer.pods(job, runtime)
    assert len(pods["node"]) == 2  # numNodes 3 - the launcher
    assert trainer.hostfile(job, runtime).splitlines() == [
        "digits-launcher-0-0.digits slots=1", "digits-node-0-0.digits slots=1", "digits-node-0-1.digits slots=1"]
    assert mpirun_of(container(pods["launcher"][0]))[:3] == ["mpirun", "-np", "3"]


def test_a_trainjobs_image_never_reaches_the_node_pods_its_env_does_with_the_launcher_as_node():
    """Why each job has its own runtime (mpijob/trainjob.py): Trainer v2.3.0 puts a TrainJob's image only in
    the launcher, so a shared runtime's node pods, where the ranks run, would keep the runtime's image. Its env
    and resourcesPerNode reach the node pods too, but only with runLauncherAsNode."""
    overrides = {"image": "user/image:2", "env": [{"name": "SEEN", "value": "1"}],
                 "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}}
    for as_node in (False, True):
        runtime, job = render_trainjob(load_spec(BASE | {"runLauncherAsWorker": as_node}))
        job["spec"]["trainer"].update(copy.deepcopy(overrides))
        pods = trainer.pods(job, runtime)
        (launcher,) = [container(p) for p in pods["launcher"]]
        nodes = [container(p) for p in pods["node"]]
        assert launcher["image"] == "user/image:2" and {"name": "SEEN", "value": "1"} in launcher["env"]
        assert launcher["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert all(n["image"] != "user/image:2" for n in nodes)
        assert all(({"name": "SEEN", "value": "1"} in n.get("env", [])) is as_node for n in nodes), as_node
        assert all((n.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == "8") is as_node for n in nodes)


def test_trainjob_jobs_fail_fast_like_the_mpijob():
    """#27 item 9: a replicated Job retries its pods backoffLimit times (Kubernetes' default 6) before
    the JobSet's failurePolicy sees it; hvdk8s's retries are runPolicy.backoffLimit, as for the MPIJob."""
    runtime, _ = render_trainjob(load_spec(BASE))
    assert trainer.job_backoff_limit(runtime, "node") == trainer.job_backoff_limit(runtime, "launcher") == 0
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 0}


def test_trainjob_refuses_volcano():
    with pytest.raises(SpecError) as info:
        checked_render_trainjob(load_spec(BASE | {"schedulerName": "volcano"}), "job.yaml")
    (error,) = info.value.errors
    assert error.startswith("schedulerName: volcano is not carried to a TrainJob")


# ---- Kueue ---------------------------------------------------------------------------------


def test_kueue_leaves_an_unlabelled_job_alone_without_a_default_queue():
    stored = kueue.on_create(mpijob_of({}))
    assert not mpi_operator.suspended(stored) and kueue.QUEUE_LABEL not in stored["metadata"]["labels"]
    labelled = kueue.on_create(mpijob_of({"queue": "team-a-gpu"}))
    assert labelled["spec"]["runPolicy"]["suspend"] is True
    assert labelled["spec"]["launcherCreationPolicy"] == "AtStartup"  # the launcher is made at once anyway
    trainjob = kueue.on_create(render_trainjob(load_spec(BASE))[1], default_local_queue=True)
    assert trainjob["spec"]["suspend"] is True and trainjob["metadata"]["labels"][kueue.QUEUE_LABEL] == "default"

