"""``hvdk8s`` command line: each subpackage registers its own subcommands.

Handlers import their heavy dependencies (TensorFlow, the Kubernetes client)
themselves, so ``hvdk8s --help`` and the manifest commands start fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hvdk8s import __version__
from hvdk8s.errors import UserError

COMMAND_MODULES = (
    "hvdk8s.launcher.cli",
    "hvdk8s.mpijob.cli",
    "hvdk8s.serving.cli",
    "hvdk8s.serving.manifests_cli",
    "hvdk8s.benchmarks.cli",
    "hvdk8s.pipeline.cli",
    "hvdk8s.migrate_cli",
    "hvdk8s.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdk8s",
        description="Horovod data-parallel Keras training, locally or as Kubeflow MPIJobs.",
    )
    parser.add_argument("--version", action="version", version=f"hvdk8s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as err:
        print(f"hvdk8s {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
