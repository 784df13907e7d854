"""``hvdk8s bench`` (also ``python -m benchmarks`` from the repository root)."""
from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hvdk8s.common.errors import UserError

from .config.knobs import KNOBS, settings_names, stacks
from .config.settings import DEFAULT_STRATEGIES, QUICK_STRATEGIES, STRATEGIES

_SIZE = re.compile(r"^(\d+)\s*([kmg]?)(i?b)?$", re.I)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """``4096``, ``4K``, ``64MiB``, ``1G`` (binary units) in bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size such as 4096, 64K or 16MiB")
    return int(match.group(1)) * _SCALE[match.group(2).lower()]


def _list(item: Callable[[str], Any], flag: str) -> Callable[[str], tuple[Any, ...]]:
    """A comma list of ``item``; ``none`` is the empty list, an empty text (``--strategies ''``, a shell variable
    left unset) is refused rather than read as ``none``."""
    def parse(text: str) -> tuple[Any, ...]:
        if text.strip().lower() == "none":
            return ()
        try:
            items = tuple(item(x) for x in text.split(",") if x.strip())
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{flag}: {err}") from None
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing: give a comma list, or none for an empty "
                                             "one")
        return items

    return parse


def _knobs(text: str) -> tuple[str, ...]:
    """A comma list; ``all`` (alone or in the list) is every Horovod/Open MPI knob, not the stack knobs, which need
    their own virtual environments and are named one by one (``all,tf2.18``)."""
    named = _list(str.strip, "--knobs")(text)
    return tuple(dict.fromkeys(k for x in named for k in (settings_names() if x == "all" else (x,))))


DEFAULT_OUT = Path("out/bench")

# flag -> (settings field, parser, help)
OVERRIDES: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "--strategies": ("strategies", _list(str.strip, "--strategies"), f"comma list of {','.join(STRATEGIES)} (default: {','.join(DEFAULT_STRATEGIES)}; "
                     f"--quick: {','.join(QUICK_STRATEGIES)})"),
    "--workloads": ("workloads", _list(str.strip, "--workloads"), "comma list of cnn,mlp and Horovod's synthetic benchmarks "
                    "as horovod-synthetic:<keras.applications model>, e.g. horovod-synthetic:MobileNetV2,horovod-synthetic:ResNet50"),
    "--ranks": ("ranks", _list(int, "--ranks"), "worker counts N, must include 1 (default 1,2)"),
    "--threads-per-rank": ("threads_per_rank", int, "TensorFlow intra-op threads per process (default 1)"),
    "--mlp-width": ("mlp_width", int, "width of the communication-heavy MLP"),
    "--warmup": ("warmup_steps", int, "untimed steps before the windows"),
    "--steps": ("steps", int, "steps per timed window"),
    "--windows": ("windows", int, "timed windows per model"),
    "--models": ("models", int, "models built one after another per launch, their windows pooled"),
    "--rounds": ("rounds", int, "launches per configuration, interleaved"),
    "--tta-max-epochs": ("tta_max_epochs", int, "epoch limit for time to accuracy"),
    "--tta-target": ("tta_target", float, "target test accuracy on digits"),
    "--sizes": ("allreduce_sizes", _list(parse_size, "--sizes"), "allreduce message sizes, e.g. 4K,1M,64M"),
    "--allreduce-min-seconds": ("allreduce_min_seconds", float, "minimum timed seconds per size and repeat"),
    "--repeats": ("allreduce_repeats", int, "repeats of every communication measurement"),
    "--fusion-tensors": ("fusion_tensors", int, "tensors per fusion test"),
    "--fusion-bytes": ("fusion_tensor_bytes", _list(parse_size, "--fusion-bytes"), "tensor sizes of the fusion test"),
    "--memcopy-bytes": ("memcopy_bytes", parse_size, "buffer of the memory-copy measurement"),
    "--emulated-rates": ("emulated_rates", _list(str.strip, "--emulated-rates"), "tc rates of the emulated links, or none"),
    "--emulated-workers": ("emulated_workers", _list(int, "--emulated-workers"), "worker counts on the emulated links"),
    "--emulated-sizes": ("emulated_sizes", _list(parse_size, "--emulated-sizes"), "message sizes on the emulated links"),
    "--emulated-train-strategies": ("emulated_train_strategies", _list(str.strip, "--emulated-train-strategies"), "strategies trained on emulated links (none: skip)"),
    "--emulated-train-steps": ("emulated_train_steps", int, "steps per window of emulated training"),
    "--emulated-train-rates": ("emulated_train_rates", _list(str.strip, "--emulated-train-rates"), "link rates to train on (among --emulated-rates)"),
    "--comm-steps": ("emulated_comm_steps", int, "parameter-server rounds per repeat"),
    "--profile-steps": ("profile_steps", int, "steps per timed window of each phase in --profile"),
    "--profile-workloads": ("profile_workloads", _list(str.strip, "--profile-workloads"),
                            "comma list of the --workloads that --profile breaks down (default: all of them)"),
    "--knobs": ("knobs", _knobs, "knobs to measure against the defaults, comma list; 'all': every Horovod/Open MPI "
                f"knob ({','.join(settings_names())}); stack knobs, whose ranks run another virtual environment, only "
                f"by name ({'; '.join(f'{k}: built by {KNOBS[k].build}' for k in stacks())})"),
    "--knob-rounds": ("knob_rounds", int, "interleaved rounds of the knob study"),
    "--synthetic-rounds": ("synthetic_rounds", int, "launches of each Horovod synthetic script per model and N"),
    "--synthetic-batches": ("synthetic_batches_per_iter", int, "batches per timed iteration of Horovod's synthetic scripts"),
    "--synthetic-iters": ("synthetic_iters", int, "timed iterations per launch of Horovod's synthetic scripts"),
    "--synthetic-peer": ("synthetic_peer", str, "folder of Horovod's own examples/tensorflow2 scripts: each round "
                         "also runs its two synthetic benchmarks (the raw one with the two Keras 3 fixes, the Keras one "
                         "after hvdk8s migrate) and the report says whether the suite's agree with them"),
    "--timeout": ("launch_timeout_s", float, "seconds before a job is killed"),
}


def _jobs(preset: str) -> int:
    """Jobs a preset runs with emulated links available (``suite.job_count``)."""
    from .config.settings import PRESETS
    from .harness.suite import job_count

    return job_count(PRESETS[preset], emulated=bool(PRESETS[preset].emulated_rates))


def _minutes(jobs: int) -> str:
    """``about 5–11 min``: ``suite.JOB_SECONDS``' range a job, each end rounded up to a minute (longer where other
    processes share the cores)."""
    from .harness.suite import JOB_SECONDS

    low, high = (-(-jobs * seconds // 60) for seconds in JOB_SECONDS)
    return f"about {low}–{high} min"


def _job_seconds() -> str:
    from .harness.suite import JOB_SECONDS

    return "–".join(str(s) for s in JOB_SECONDS)


def register(sub: argparse._SubParsersAction) -> None:
    from .reporting.costmodel import NETWORKS

    p = sub.add_parser(
        "bench",
        help="benchmark hvdk8s against raw Horovod and TF strategies; write results.json, report.md, plots",
        description="Measure training throughput, scaling efficiency, time to accuracy, allreduce bandwidth and "
        "bandwidth-limited (network-namespace) clusters side by side, fit an alpha-beta cost model and "
        "extrapolate it. The run prints the job count and an estimate of its time first, then each job as it starts "
        f"([bench k/total]); a job takes about {_job_seconds()} s on an idle 2-core machine (about the average job of "
        "two quiet runs on the development VM, on two days) and more on a shared one.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="preset", action="store_const", const="quick",
                      help=f"the strategy comparison: hvdk8s, the raw loop (also at TensorFlow's default threads and at "
                           f"hvdk8s's thread split), MultiWorkerMirrored and parameter server at N=1,2, one launch each, and the "
                           f"allreduce microbenchmark; no emulated links: {_jobs('quick')} jobs (+1 with --profile), "
                           f"{_minutes(_jobs('quick'))} on an idle 2-core machine (default: full)")
    mode.add_argument("--brief", dest="preset", action="store_const", const="brief",
                      help=f"the headline only, {_jobs('brief')} jobs: hvdk8s / raw loop in alternating windows at N=1 and N=2 "
                           "(3 rounds), the raw loop at TensorFlow's default threads and at hvdk8s's split at N=2, and the "
                           f"allreduce microbenchmark; no time to accuracy, no emulated links; {_minutes(_jobs('brief'))} "
                           "on an idle 2-core machine")
    mode.add_argument("--full", dest="preset", action="store_const", const="full",
                      help=f"longer windows, 3 rounds, every default strategy and emulated links: {_jobs('full')} jobs")
    p.set_defaults(preset="full")
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {DEFAULT_OUT}; with --report-only: "
                   "where the report, its plots and the re-derived results file go, leaving RESULTS_JSON as it is)")
    p.add_argument("--no-tta", dest="tta", action="store_false", default=None, help="skip time to accuracy")
    p.add_argument("--profile", action="store_true", default=None,
                   help="add a per-phase breakdown of the N=2 step (hvdk8s and the raw loop) and a Horovod timeline")
    p.add_argument("--report-only", type=Path, metavar="RESULTS_JSON", help="re-render the report from a results file, "
                   "beside it (its derived summaries rewritten) unless --out is given")
    p.add_argument("--serving", action="store_true", help="benchmark hvdk8s serve instead (REST/gRPC, batching on/off; "
                   "writes serving.json/.md/.png; about 10 min, 2 with --quick: shorter loads and a 30 s soak)")
    p.add_argument("--chaos", type=int, metavar="N", help="run N elastic jobs that each lose a worker at a random "
                   "point instead; report survived / lost steps / time to recover (chaos.md, chaos.png)")
    for flag, (_field, parse, text) in OVERRIDES.items():
        p.add_argument(flag, type=parse, default=None, help=text)
    k8s = p.add_argument_group(
        "on a Kubernetes cluster (--cluster)",
        "The training matrix (--strategies, default hvdk8s,horovod,tf_mwms,tf_ps, at each N of --ranks) and an "
        "allreduce job at each N >= 2, as MPI Operator MPIJobs and Training Operator TFJobs of N worker pods, from one "
        "job file (image, queue, GPUs, node selectors, tolerations, RDMA resources): render prints them as YAML; "
        "submit runs them one at a time (create, wait, keep the result pod's log, delete) and writes results.json, "
        "report.md and plots to --out; collect does the same from logs saved as <job>.log in --logs.")
    k8s.add_argument("--cluster", choices=("render", "submit", "collect"), help="run the matrix on a cluster (see above)")
    k8s.add_argument("--job-file", metavar="JOB.yaml", help="hvdk8s job file every job is built from, without "
                     "command and workers (the benchmark sets them); its name is the jobs' prefix (default bench)")
    k8s.add_argument("--image", help="image with hvdk8s installed (Dockerfile.gpu); overrides the job file's")
    k8s.add_argument("--network", default="25 GbE", choices=NETWORKS, metavar="NETWORK",
                     help="the cluster's network as the cost model names it, for the predicted allreduce bus bandwidth: "
                     f"{', '.join(repr(name) for name in NETWORKS)} (default 25 GbE)")
    k8s.add_argument("--logs", type=Path, metavar="DIR", help="collect: the folder of the jobs' logs (<job>.log: "
                     "kubectl logs of the MPIJob's launcher, the TFJob's chief or worker 0)")
    k8s.add_argument("--kubeconfig", help="submit: kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    k8s.add_argument("--context", help="submit: kubeconfig context")
    k8s.add_argument("-n", "--namespace", help="submit: namespace (default: the job file's, else the context's)")
    p.set_defaults(handler=run, command_line=None)


# Each settings field as the command line sets it, for its errors: --rounds, not rounds.
FLAG_OF = {field: flag for flag, (field, _p, _t) in OVERRIDES.items()} | {"tta": "--no-tta", "profile": "--profile"}


# The flags that each choose what the run is instead of the suite; at most one of them
MODES = {"report_only": "--report-only", "cluster": "--cluster", "chaos": "--chaos", "serving": "--serving"}


def check_args(args: argparse.Namespace) -> None:
    """The flags outside the suite's settings, checked before anything starts (``settings_from_args`` checks the
    settings): one mode at most, ``--chaos N`` with N >= 1, ``--cluster collect``'s ``--logs`` an existing folder.

    Raises:
        SpecError: Every problem, each under its flag.
    """
    from hvdk8s.common.fields import FieldError, SpecError, at_least, invalid, required

    errors: list[FieldError] = []
    given = [flag for name, flag in MODES.items() if getattr(args, name, None) is not None
             and getattr(args, name) is not False]  # --chaos 0 is given (and refused below)
    if len(given) > 1:
        errors.append(FieldError("Forbidden", given[1], f"cannot be combined with {given[0]}: each runs something "
                                 "else (one of " + ", ".join(MODES.values()) + ")"))
    errors += at_least("--chaos", getattr(args, "chaos", None), 1)
    if getattr(args, "cluster", None) == "collect":
        logs = args.logs
        if logs is None:
            errors.append(required("--logs", "--cluster collect needs it: the folder of the jobs' <job>.log files"))
        elif not logs.is_dir():
            errors.append(invalid("--logs", f"{logs}: " + ("not a folder" if logs.exists() else "no such folder")
                                  + " (the folder of the jobs' <job>.log files)"))
    if errors:
        raise SpecError("command line", errors)


def settings_from_args(args: argparse.Namespace) -> Any:
    from hvdk8s.common.fields import SpecError

    from .config.settings import SettingsError, preset, validate

    overrides = {field: getattr(args, flag.lstrip("-").replace("-", "_")) for flag, (field, _p, _t) in OVERRIDES.items()}
    overrides["tta"] = args.tta
    overrides["profile"] = args.profile
    try:
        return preset(args.preset, **overrides)
    except SettingsError as err:
        preset_flag = "" if args.preset == "full" else f" (--{args.preset})"
        raise SpecError(f"command line{preset_flag}", validate(err.settings, spell=lambda f: FLAG_OF.get(f, f))) from None
    except ValueError as err:
        raise UserError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    """``hvdk8s bench``'s handler: run what the flags ask for and write its results and report.

    One of: re-render a report from a results file (``--report-only``), a cluster run (``--cluster``), the
    elastic chaos runs (``--chaos``), the serving benchmark (``--serving``), or the suite in ``args.out``
    (``results.json``, ``report.md`` and the plots), saved after every job.

    Args:
        args: The parsed ``hvdk8s bench`` flags (see the command-line reference).

    Returns:
        The exit status: 0 when everything ran, non-zero when a job failed (the later jobs still ran; each
        failure is printed and recorded in the results).

    Raises:
        UserError: Settings that cannot run, a results file that cannot be rendered, or a stack knob
            whose interpreter is missing or broken; nothing is started then.
    """
    from hvdk8s.common import atomic

    from .harness import cluster_collect
    from .reporting import report

    check_args(args)
    if args.report_only:
        source = f"--report-only {args.report_only}"
        results = _read_results(args.report_only, source)
        # beside the results file, whose derived summaries are rewritten; with --out there, the source left as it is
        out = args.report_only.parent if args.out is None else args.out
        try:  # summaries always from the raw timings, with today's analysis, kept in the results file too
            paths = report.write(cluster_collect.derived(results), out)
            atomic.write_json(args.report_only if args.out is None else out / "results.json", results)
        except ValueError as err:  # the cost model's measured H100 rates are missing
            raise UserError(str(err)) from None
        except (KeyError, TypeError, AttributeError, IndexError) as err:  # a part of it not what analysis reads
            raise UserError(f"{source}: not a results file this hvdk8s bench can render ({type(err).__name__}: "
                            f"{err})") from None
        print(f"hvdk8s bench: wrote {paths['markdown']}")
        return 0
    if args.out is None:
        args.out = DEFAULT_OUT
    if args.cluster:
        return _cluster(args)
    if args.chaos is not None:
        from .harness import chaos

        return chaos.main(args.chaos, random.randrange(2**31), args.out, args.command_line or ["hvdk8s", *sys.argv[1:]])
    if args.serving:
        from .harness import serving_bench

        settings = serving_bench.QUICK if args.preset == "quick" else serving_bench.Settings()
        paths = serving_bench.write(serving_bench.run(settings, args.command_line or ["hvdk8s", *sys.argv[1:]]),
                                    args.out)
        print(f"hvdk8s bench: wrote {paths['markdown']}", flush=True)
        return 0
    from .harness.suite import Suite

    settings = settings_from_args(args)
    try:
        suite = Suite(settings, args.out, args.command_line or ["hvdk8s", *sys.argv[1:]])
    except ValueError as err:  # a stack knob's interpreter is missing or broken, or the H100 rates: nothing was started
        raise UserError(str(err)) from None
    jobs = suite.progress.total
    print(f"hvdk8s bench: {jobs} jobs, {_minutes(jobs)} (an estimate: {_job_seconds()} s a job on an idle 2-core "
          "machine; longer where other processes share the cores)", file=sys.stderr, flush=True)
    results = suite.run()
    paths = report.write(results, args.out)
    print(f"hvdk8s bench: wrote {args.out / 'results.json'} and {paths['markdown']}", flush=True)
    for failure in results["errors"]:
        print(f"hvdk8s bench: error in {failure['job']}: {failure['error'].splitlines()[0]}", file=sys.stderr)
    return 1 if results["errors"] else 0


def _cluster(args: argparse.Namespace) -> int:
    """``--cluster render|submit|collect`` (see the argument group's description)."""
    import datetime as dt

    from hvdk8s.common import atomic

    from .harness import cluster_collect, cluster_jobs
    from .harness.suite import Progress

    if args.strategies is None:
        args.strategies = cluster_jobs.DEFAULT_CLUSTER_STRATEGIES
    settings = settings_from_args(args)
    base, origin = cluster_jobs.base_job(args.job_file, args.image)
    jobs = cluster_jobs.matrix(settings, base, origin)
    if args.cluster == "render":
        sys.stdout.write(cluster_jobs.render_yaml(jobs))
        return 0
    command = args.command_line or ["hvdk8s", *sys.argv[1:]]
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    logs: list[cluster_collect.JobLog] = []

    def save(report: bool = True) -> dict[str, Any]:
        """results.json of the jobs so far, with the report and plots unless ``report`` is False."""
        results = cluster_collect.results(settings, logs, network=args.network, command=command, started=started)
        if report:
            cluster_collect.write(results, args.out)
        else:
            atomic.write_json(args.out / "results.json", results)
        return results

    if args.cluster == "collect":  # --logs: an existing folder (check_args)
        for job in jobs:
            path = args.logs / f"{job.name}.log"
            logs.append(cluster_collect.JobLog(job, path.read_text(errors="replace")) if path.is_file() else
                        cluster_collect.JobLog(job, "", error=f"no log {path}"))
        results = save()
    else:
        from hvdk8s.cluster import client

        from .harness import cluster_submit

        cluster = client.connect(args.kubeconfig, args.context)
        namespace = client.resolve_namespace(args.namespace, base.get("namespace"), cluster.namespace)
        try:
            for log in cluster_submit.run_jobs(cluster, namespace, jobs, args.out / "logs", Progress(len(jobs)).step):
                logs.append(log)
                save(report=False)
        except BaseException:  # the API or Ctrl-C: the report of what was measured, then the error
            if logs:
                save()
            raise
        results = save()
    print(f"hvdk8s bench: wrote {args.out / 'results.json'} and {args.out / 'report.md'}", flush=True)
    for failure in results["errors"]:
        print(f"hvdk8s bench: error in {failure['job']}: {failure['error'].splitlines()[0]}", file=sys.stderr)
    return 1 if results["errors"] else 0


def _read_results(path: Path, source: str) -> dict[str, Any]:
    """A ``results.json`` for ``--report-only``; a file that is not one is the user's to fix, named."""
    import json

    from hvdk8s.common import files
    from hvdk8s.common.fields import value_kind

    try:
        results = json.loads(files.read_text(path, source))
    except json.JSONDecodeError as err:  # before ValueError, its base
        raise UserError(f"{source}: not JSON: {err}") from None
    except (FileNotFoundError, ValueError) as err:  # missing, unreadable, not UTF-8: files names which
        raise UserError(str(err)) from None
    if not isinstance(results, dict) or "raw" not in results:
        raise UserError(f"{source}: not an hvdk8s bench results file (no 'raw' timings)")
    if not isinstance(results["raw"], dict):
        raise UserError(f"{source}: not an hvdk8s bench results file ('raw' is {value_kind(results['raw'])}, expected "
                        "an object of timings by section: training, allreduce, ...)")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks [flags]``: ``hvdk8s bench`` without the ``hvdk8s`` front end.

    Args:
        argv: The flags, as ``hvdk8s bench`` takes them; None for ``sys.argv[1:]``.

    Returns:
        The exit status: 0 when everything ran, non-zero when a job failed, 2 for settings that cannot
        run (the error is printed).

    Raises:
        SystemExit: Flags that argparse refuses (status 2, after printing the usage), and ``--help``.

    Example:
        ```python
        from hvdk8s.benchmarks.cli import main

        main(["--quick", "--out", "out/bench"])  # as `hvdk8s bench --quick --out out/bench`
        ```
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["bench", *given])
    args.command_line = ["python", "-m", __package__, *given]
    try:
        return int(args.handler(args) or 0)
    except UserError as err:
        print(f"hvdk8s bench: error: {err}", file=sys.stderr)
        return 2
