"""Run a command "on" an emulated host: inside its network namespace, under its own hostname.

Two uses, both as a standalone script (no package imports):

* Open MPI's remote launcher (``-mca plm_rsh_agent "python netns_agent.py"``):
  mpirun calls it like ssh, ``netns_agent.py HOST COMMAND...``, and it runs the
  command through ``sh -c`` (as sshd would) inside namespace HOST;
* ``netns_agent.py --as-host HOST -- ARGV...`` (already inside HOST's namespace
  and a fresh UTS namespace): set the hostname to HOST, then exec ARGV.

The hostname matters: Open MPI and Horovod tell hosts apart by it, and all
namespaces would otherwise share the machine's name.
"""
from __future__ import annotations

import os
import re
import socket
import sys

PREFIX = "hvbench-"
_HOST = re.compile(rf"^{PREFIX}[a-z0-9-]+$")


def _checked(host: str) -> str:
    if not _HOST.match(host):
        raise SystemExit(f"netns_agent: refusing host {host!r}: not one of this benchmark's namespaces ({PREFIX}*)")
    return host


def main(argv: list[str]) -> None:
    if argv[:1] == ["--as-host"]:
        host = _checked(argv[1])
        if argv[2:3] != ["--"] or len(argv) < 4:
            raise SystemExit("usage: netns_agent.py --as-host HOST -- ARGV...")
        socket.sethostname(host)
        os.execvp(argv[3], argv[3:])
    if len(argv) < 2:
        raise SystemExit("usage: netns_agent.py HOST COMMAND...")
    host = _checked(argv[0])
    command = " ".join(argv[1:])  # ssh semantics: the remote shell parses the joined words
    os.execvp(
        "ip",
        ["ip", "netns", "exec", host, "unshare", "--uts", sys.executable, os.path.abspath(__file__),
         "--as-host", host, "--", "sh", "-c", command],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
