"""Open MPI's remote launcher into the emulated pods of tests/test_cluster_bench_e2e.py, in place of ssh.

mpirun calls it as it calls ssh (``-mca plm_rsh_agent``): ``netns_pod_agent.py [-o OPTION]... HOST COMMAND...``,
HOST a name from the MPI Operator's hostfile. It runs COMMAND through ``sh -c``, as sshd would, in the
network namespace of the pod of that name and under the pod's hostname. The pods are listed in the JSON file
``$HVDK8S_TEST_PODS`` (name -> {"netns", "hostname"}). A standalone script: no package imports.
"""
from __future__ import annotations

import json
import os
import sys

OPTIONS_WITH_VALUE = ("-o", "-p", "-i", "-l")  # ssh's, as plm_rsh_args may pass them (-o ConnectionAttempts=10)


def main(argv: list[str]) -> None:
    while argv and argv[0].startswith("-"):
        argv = argv[2:] if argv[0] in OPTIONS_WITH_VALUE else argv[1:]
    if len(argv) < 2:
        raise SystemExit("usage: netns_pod_agent.py [-o OPTION]... HOST COMMAND...")
    with open(os.environ["HVDK8S_TEST_PODS"]) as f:
        pods = json.load(f)
    if argv[0] not in pods:
        raise SystemExit(f"netns_pod_agent: {argv[0]!r} is not one of this job's pods ({', '.join(pods)})")
    pod = pods[argv[0]]
    # The rest of the launcher's environment stands in for the worker pod's own (the same image and variables);
    # its node name does not: sshd starts the command in a fresh environment, without the launcher's variables.
    os.environ.pop("HVDK8S_NODE_NAME", None)
    os.execvp("ip", ["ip", "netns", "exec", pod["netns"], "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec sh -c "$1"',
                     pod["hostname"], " ".join(argv[1:])])


if __name__ == "__main__":
    main(sys.argv[1:])
