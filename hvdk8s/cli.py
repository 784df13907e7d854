"""``hvdk8s`` command line: each subpackage registers its own subcommands.

This module is the top of the layers: it imports every package's ``cli``
module, and nothing imports it. Handlers import their heavy dependencies
(TensorFlow, the Kubernetes client) themselves, so ``hvdk8s --help`` and the
manifest commands start fast.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hvdk8s import __version__, doctor
from hvdk8s.benchmarks import cli as benchmarks_cli
from hvdk8s.cluster import cli as cluster_cli
from hvdk8s.common.errors import UserError
from hvdk8s.common.quiet import quiet_tensorflow
from hvdk8s.launcher import cli as launcher_cli
from hvdk8s.migrate import cli as migrate_cli
from hvdk8s.mpijob import cli as mpijob_cli
from hvdk8s.pipeline import cli as pipeline_cli
from hvdk8s.serving import cli as serving_cli
from hvdk8s.serving.kube import cli as manifests_cli

COMMAND_MODULES = (
    launcher_cli, cluster_cli, mpijob_cli, serving_cli, manifests_cli, benchmarks_cli, pipeline_cli, migrate_cli, doctor,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdk8s",
        description="Horovod data-parallel Keras training, locally or as Kubeflow MPIJobs.",
    )
    parser.add_argument("--version", action="version", version=f"hvdk8s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="keep TensorFlow's start-up INFO/WARNING lines (off by default, in every rank too; "
                             "also HVDK8S_VERBOSE=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_tensorflow(verbose=args.verbose)  # before any handler loads TensorFlow or launches ranks
    try:
        return int(args.handler(args) or 0)
    except UserError as err:
        print(f"hvdk8s {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.filename is None:  # not about a path: a fault to see whole
            raise
        # a path the user gave (or one under it) cannot be read or written: the path and the system's reason
        paths = " -> ".join(os.fspath(f) for f in (err.filename, err.filename2) if f is not None)
        print(f"hvdk8s {args.command}: error: {paths}: {err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
