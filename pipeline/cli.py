"""``hvdk8s pipeline render|run|submit|ingest``: one pipeline file, the Argo Workflow or a local run."""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "pipeline", help="ingest -> train candidates -> select -> serve -> load test, on Argo or locally",
        description="Run a pipeline file's DAG: render it as an Argo Workflow, submit that to a cluster, "
        "or run the same steps on this machine.")
    commands = parser.add_subparsers(dest="pipeline_command", required=True, metavar="COMMAND")

    render = commands.add_parser("render", help="print the Argo Workflow (or, with --rbac, its RBAC objects)")
    render.add_argument("file", type=Path, help="pipeline YAML")
    render.add_argument("--rbac", action="store_true", help="the ServiceAccount, Role and RoleBinding instead")
    render.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (atomically)")
    render.set_defaults(handler=_render)

    run = commands.add_parser("run", help="run the pipeline on this machine",
                              description="Train the candidates with hvdk8s run, select, export, serve and "
                              "load-test; prints a summary table and writes OUT/summary.png.")
    run.add_argument("file", type=Path, help="pipeline YAML")
    run.add_argument("--out", type=Path, help="output folder (default: out/pipeline/NAME)")
    run.set_defaults(handler=_run)

    submit = commands.add_parser("submit", help="create the Workflow on Kubernetes (Argo Workflows installed)")
    submit.add_argument("file", type=Path, help="pipeline YAML")
    submit.add_argument("--wait", action="store_true", help="follow its steps; exit 0 if it Succeeded, else 1")
    from hvdk8s.cluster.cli import cluster_flags

    cluster_flags(submit)
    submit.set_defaults(handler=_submit)

    ingest = commands.add_parser("ingest", help="write the held-out set as .npz (the Workflow's ingest step)")
    ingest.add_argument("--source", required=True, choices=("digits", "imageFolder", "tfds"))
    ingest.add_argument("--split", default="test")
    ingest.add_argument("--path", help="image folder, or TFDS data_dir")
    ingest.add_argument("--name", help="TFDS dataset name")
    ingest.add_argument("--image-size", type=_image_size, default=28, help="square side in pixels (default 28)")
    ingest.add_argument("--color-mode", choices=("grayscale", "rgb"), default="grayscale")
    ingest.add_argument("--out", type=Path, required=True, help=".npz to write (arrays x, y)")
    ingest.set_defaults(handler=_ingest)


def _render(args: argparse.Namespace) -> int:
    from hvdk8s.common.atomic import write_text
    from hvdk8s.common.errors import UserError
    from hvdk8s.common.files import to_yaml
    from hvdk8s.pipeline import build, load_pipeline, rbac, render_workflow

    pipeline = load_pipeline(args.file)
    objects = rbac(pipeline) if args.rbac else [render_workflow(build(pipeline))]
    text = to_yaml(*objects)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        write_text(args.output, text)
    except OSError as exc:
        raise UserError(f"-o {args.output}: {exc.strerror}") from None
    return 0


def _run(args: argparse.Namespace) -> int:
    from hvdk8s.pipeline import build, load_pipeline, local, report

    pipeline = load_pipeline(args.file)
    dag = build(pipeline)
    out = args.out or Path("out") / "pipeline" / pipeline.name
    with _sigterm_exits():
        result = local.run(dag, out, base_dir=args.file.parent)
    print()
    print(report.table(dag, result))
    report.plot(dag, result, out / "summary.png")
    ok = local.succeeded(dag, result)
    print(f"\npipeline {pipeline.name}: {'succeeded' if ok else 'FAILED'}; plot: {out / 'summary.png'}")
    return 0 if ok else 1


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (``timeout``, a CI runner cancelling) ends the run as Ctrl-C does, through ``local.run``'s
    clean-up, which stops the jobs and the server: they run in their own sessions, so without a handler
    Python would die at once and leave them running. Exit status 143, as if killed by the signal."""
    def exit_once(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _submit(args: argparse.Namespace) -> int:
    from hvdk8s.pipeline import build, load_pipeline, render_workflow, submit

    workflow = render_workflow(build(load_pipeline(args.file)))
    return submit.submit(workflow, args.kubeconfig, args.context, args.namespace, wait=args.wait)


def _image_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be positive")
    return size


def _ingest(args: argparse.Namespace) -> int:
    from hvdk8s.common.errors import UserError
    from hvdk8s.pipeline import ingest

    try:
        x, y = ingest.heldout(args.source, args.split, args.image_size, args.color_mode, args.path, args.name)
    except (ValueError, FileNotFoundError) as err:
        raise UserError(str(err)) from None
    ingest.write_npz(args.out, x, y)
    print(f"wrote {len(y)} held-out images {x.shape[1:]} to {args.out}")
    return 0
