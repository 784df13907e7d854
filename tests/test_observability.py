"""Observability: Prometheus endpoints of a real 2-rank run, GPU telemetry, progress, TensorBoard.

The 2-rank job (tests/mpi_scripts/obs_train.py) runs once per module through
``hvdk8s run --timeline`` with HVDK8S_METRICS_PORT and HVDK8S_JOB_NAME set as
the MPIJob manifests set them; its endpoints are scraped over HTTP while the
ranks wait, then the job is released and its output, TensorBoard dir and
Horovod timeline are checked. The NVML path runs through the real pynvml
bindings against a stub libnvidia-ml.so compiled here, returning NVML's own
error codes; this host has no GPU, so its no-NVML path is the real one.
"""
from __future__ import annotations

import ctypes.util
import json
import logging
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from pathlib import Path

import portpicker
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hvdk8s.common.errors import UserError
from hvdk8s.observe import ranklog, telemetry
from hvdk8s.observe.metrics import Exporter, metrics_port, rank_labels

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "mpi_scripts" / "obs_train.py"
EPOCHS, STEPS_PER_EPOCH, BATCH = 3, 8, 16  # obs_train.py: 256 samples, 2 ranks
LABELS = {"job": "obs-test", "rank": "0", "local_rank": "0", "host": "h"}


def samples(text: str) -> dict[str, list]:
    """Scrape text -> {sample name: [Sample, ...]} through Prometheus's own parser."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def only(scrape: dict[str, list], name: str) -> float:
    (sample,) = scrape[name]
    return sample.value


# --------------------------------------------------------------------------- pure parts


def test_metrics_port_is_base_plus_local_rank_from_env_or_argument() -> None:
    assert metrics_port({}, 0) == 9090
    assert metrics_port({}, 3) == 9093
    assert metrics_port({"HVDK8S_METRICS_PORT": "19000"}, 1) == 19001
    assert metrics_port({"HVDK8S_METRICS_PORT": "19000"}, 1, port=8000) == 8001
    assert metrics_port({"HVDK8S_METRICS_PORT": "0"}, 5) == 0
    assert metrics_port({}, 2, port=0) == 0


@pytest.mark.parametrize("environ,port,needle", [
    ({"HVDK8S_METRICS_PORT": "http"}, None, "HVDK8S_METRICS_PORT='http'"),
    ({"HVDK8S_METRICS_PORT": "-5"}, None, "HVDK8S_METRICS_PORT='-5'"),
    ({}, 65535, "metrics port 65535 + local rank 1"),
])
def test_metrics_port_rejects_bad_values_naming_them(environ: dict, port: int | None, needle: str) -> None:
    with pytest.raises(UserError, match=needle.replace("+", r"\+")):
        metrics_port(environ, 1, port)


def test_rank_labels() -> None:
    assert rank_labels({"HVDK8S_JOB_NAME": "mnist-7"}, 3, 1) == {
        "job": "mnist-7", "rank": "3", "local_rank": "1", "host": socket.gethostname()
    }
    assert rank_labels({}, 0, 0)["job"] == "hvdk8s"


@pytest.mark.parametrize("cvd,count,local_rank,expected", [
    (None, 4, 1, "1"),
    (None, 2, 3, "1"),            # more ranks than GPUs (refused by hvdk8s.init()): wrap
    ("2,3", 4, 1, "3"),
    ("GPU-aa,GPU-bb", 2, 0, "GPU-aa"),
    ("1,7,0", 2, 1, "1"),         # CUDA stops at the first invalid index: only "1" is visible
    ("-1", 4, 0, None),
    ("", 4, 0, None),
    (None, 0, 0, None),
])
def test_pinned_device_follows_cuda_visible_devices(cvd: str | None, count: int, local_rank: int, expected: str | None) -> None:
    assert telemetry.pinned_device(cvd, count, local_rank) == expected


# --------------------------------------------------------------------------- exporter without training


def test_exporter_serves_rank_series_and_job_series_only_on_rank_0() -> None:
    chief, worker = Exporter(LABELS, chief=True), Exporter({**LABELS, "rank": "1"}, chief=False)
    say = []
    for exp in (chief, worker):
        exp.serve(0, say.append)
        exp.examples.inc(32)
        exp.set_job({"examples_per_second": 123.5})
    assert say == [] and chief.port and worker.port and chief.port != worker.port
    scraped = [samples(urllib.request.urlopen(f"http://127.0.0.1:{e.port}/metrics", timeout=10).read().decode()) for e in (chief, worker)]
    assert [s["hvdk8s_examples_total"][0].labels for s in scraped] == [LABELS, {**LABELS, "rank": "1"}]
    assert only(scraped[0], "hvdk8s_job_examples_per_second") == 123.5
    assert scraped[0]["hvdk8s_job_examples_per_second"][0].labels == {"job": "obs-test"}
    assert not [name for name in scraped[1] if name.startswith("hvdk8s_job_")]


def test_busy_port_turns_the_endpoint_off_without_raising() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said: list[str] = []
        exp = Exporter(LABELS, chief=False)
        exp.serve(port, said.append)
    assert exp.port is None
    assert len(said) == 1 and f"cannot listen on port {port}" in said[0] and "training goes on" in said[0]


def test_log_once_is_once_per_process_and_host_wide_only_on_local_rank_0(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hvdk8s")
    for local_rank in (1, 0, 0, 1):
        ranklog.log_once("host has no widgets (test)", rank=4 + local_rank, local_rank=local_rank, host_wide=True)
    ranklog.log_once("rank-level note (test)", rank=5, local_rank=1)
    ranklog.log_once("rank-level note (test)", rank=5, local_rank=1)
    assert [r.getMessage() for r in caplog.records] == [
        "hvdk8s[rank 4]: host has no widgets (test)",
        "hvdk8s[rank 5]: rank-level note (test)",
    ]


# --------------------------------------------------------------------------- allreduce clock


def test_allreduce_clock_counts_only_the_communication_left_after_the_last_gradient() -> None:
    import tensorflow as tf

    from hvdk8s import commtime

    def sleeping(seconds: float):
        def work(t):
            time.sleep(seconds)
            return t * 2
        return work

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        # Not stateful, like gradients and Horovod's ops: TensorFlow orders only stateful ops by program order.
        grad = tf.numpy_function(sleeping(0.3), [x], tf.float32, stateful=False)  # backprop: not communication
        reduced = tf.numpy_function(sleeping(0.05), [grad], tf.float32, stateful=False)  # the exposed "allreduce"
        commtime.record_exposed([grad], [reduced])
        return reduced

    seconds0, calls0 = commtime.read()
    outputs = [step(tf.constant([1.0, 2.0])) for _ in range(3)]
    seconds, calls = commtime.read()
    assert calls - calls0 == 3
    assert 3 * 0.05 <= seconds - seconds0 < 3 * 0.3  # with the 0.3 s of "backprop" it would be >= 1.05 s
    assert outputs[0].numpy().tolist() == [4.0, 8.0]


# --------------------------------------------------------------------------- epoch-end collectives


@pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")  # TF may already run here
@pytest.mark.parametrize("linked", [True, False])
def test_job_figures_ride_the_metric_average_allreduce_or_take_their_own(
    monkeypatch: pytest.MonkeyPatch, linked: bool
) -> None:
    """One rank in-process: which allreduces an epoch end makes, and that the logs get the job figures either way."""
    import keras
    import numpy as np

    import hvdk8s
    from hvdk8s import collectives
    from hvdk8s.observe import metrics
    from hvdk8s.observe.observability import observability_callbacks

    hvdk8s.init(quiet=True)
    calls: list[tuple[str, list[str]]] = []
    average = collectives.average_scalars

    def spy(values: dict, name: str = "hvdk8s.metrics") -> dict:
        calls.append((name, sorted(values)))
        return average(values, name=name)

    monkeypatch.setattr(collectives, "average_scalars", spy)
    monkeypatch.setattr(metrics, "_exporter", Exporter(LABELS, chief=True))  # not served: no port, no NVML probe
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=hvdk8s.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss="sparse_categorical_crossentropy")
    metric_average = hvdk8s.callbacks.MetricAverageCallback()
    callbacks = [metric_average, *observability_callbacks(
        progress=False, metric_average=metric_average if linked else None)]
    x, y = np.ones((32, 4), "float32"), np.zeros(32, "int32")
    history = model.fit(x, y, batch_size=8, epochs=2, callbacks=callbacks, verbose=0).history

    figures = ["allreduce_seconds", "examples_per_second", "step_seconds"]
    per_epoch = [("hvdk8s.metrics", sorted(["loss", *figures]))] if linked else [
        ("hvdk8s.metrics", ["loss"]), ("hvdk8s.observability", figures)]
    assert calls == per_epoch * 2
    assert sorted(history) == sorted(["loss", *figures])
    assert all(rate > 0 for rate in history["examples_per_second"])


# --------------------------------------------------------------------------- NVML


def test_no_nvml_library_means_no_gpu_metrics_and_nothing_said(caplog: pytest.LogCaptureFixture) -> None:
    """A host without NVIDIA's driver library has no GPU to watch: a CPU machine is told nothing about GPUs."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this host has libnvidia-ml: the no-NVML path is only real without it")
    caplog.set_level(logging.DEBUG, logger="hvdk8s")
    results = [
        telemetry.gpu_telemetry(LABELS, rank=rank, local_rank=rank, cuda_visible_devices=None) for rank in (0, 1, 0)
    ]
    assert results == [None, None, None]
    assert [r.getMessage() for r in caplog.records] == []


# A libnvidia-ml.so.1 with 2 GPUs: GPU 0 reads everything but power (NOT_SUPPORTED,
# as on many boards); GPU 1's temperature fails with GPU_IS_LOST. nvmlInit returns
# STUB_NVML_INIT_RC when set (DRIVER_NOT_LOADED: a container without the driver).
# Memory comes only from the version-2 call (a reserve apart from "used", as drivers
# since 510 report it), and only for the struct version NVML defines for it.
NVML_STUB = r"""
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem_v2_t;
static int devices[2];
int nvmlInitWithFlags(unsigned int flags) { const char *rc = getenv("STUB_NVML_INIT_RC"); return rc ? atoi(rc) : 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int rc) { return "stub"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if (i > 1) return 2; *h = &devices[i]; return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    if (strcmp(uuid, "GPU-stub-0") == 0) { *h = &devices[0]; return 0; }
    return 6;  /* NVML_ERROR_NOT_FOUND */
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { u->gpu = h == &devices[0] ? 87 : 42; u->memory = 10; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *h, mem_v2_t *m) {
    if (m->version != (unsigned int)(sizeof(mem_v2_t) | 2 << 24)) return 25;  /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = 80ULL << 30; m->reserved = 1ULL << 29; m->used = 3ULL << 30; m->free = m->total - m->reserved - m->used;
    return 0;
}
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *t) { if (h == &devices[1]) return 15; *t = 61; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) { return 3;  /* NVML_ERROR_NOT_SUPPORTED */ }
"""

PROBE = textwrap.dedent("""
    import json, logging, sys
    from prometheus_client import CollectorRegistry, generate_latest
    from hvdk8s.observe import telemetry
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    local_rank, cvd = int(sys.argv[1]), sys.argv[2] or None
    labels = {"job": "t", "rank": str(local_rank), "local_rank": str(local_rank), "host": "h"}
    gpu = telemetry.gpu_telemetry(labels, rank=local_rank, local_rank=local_rank, cuda_visible_devices=cvd)
    scrapes = []
    if gpu is not None:
        registry = CollectorRegistry()
        registry.register(gpu)
        scrapes = [generate_latest(registry).decode() for _ in range(2)]
    print(json.dumps(scrapes))
""")


@pytest.fixture(scope="module")
def nvml_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the NVML stub")
    folder = tmp_path_factory.mktemp("nvml")
    (folder / "stub.c").write_text(NVML_STUB)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "libnvidia-ml.so.1"), str(folder / "stub.c")], check=True)
    return folder


def probe(stub: Path, local_rank: int, cvd: str = "", **env: str) -> tuple[list[dict[str, list]], list[str]]:
    """Run the telemetry collector in a process that loads the stub as libnvidia-ml.so.1."""
    environ = {**os.environ, "LD_LIBRARY_PATH": str(stub), **env}
    done = subprocess.run([sys.executable, "-c", PROBE, str(local_rank), cvd], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [samples(text) for text in json.loads(done.stdout)], done.stderr.splitlines()


def test_nvml_readings_for_the_pinned_gpu_with_unsupported_power_left_out(nvml_stub: Path) -> None:
    scrapes, log = probe(nvml_stub, local_rank=0)
    for scrape in scrapes:
        assert only(scrape, "hvdk8s_gpu_utilization_ratio") == 0.87
        assert only(scrape, "hvdk8s_gpu_memory_used_bytes") == 3 * 2**30
        assert only(scrape, "hvdk8s_gpu_memory_total_bytes") == 80 * 2**30
        assert only(scrape, "hvdk8s_gpu_temperature_celsius") == 61
        assert "hvdk8s_gpu_power_watts" not in scrape
        assert scrape["hvdk8s_gpu_temperature_celsius"][0].labels == {
            "job": "t", "rank": "0", "local_rank": "0", "host": "h", "gpu": "0"
        }
    assert log == ["hvdk8s[rank 0]: GPU 0 does not report hvdk8s_gpu_power_watts (NVML: Not Supported); leaving it out"]


def test_nvml_failing_reading_is_skipped_and_said_once(nvml_stub: Path) -> None:
    scrapes, log = probe(nvml_stub, local_rank=1)  # rank 1 -> GPU 1, whose temperature read fails
    for scrape in scrapes:
        assert scrape["hvdk8s_gpu_utilization_ratio"][0].labels["gpu"] == "1"
        assert only(scrape, "hvdk8s_gpu_utilization_ratio") == 0.42
        assert "hvdk8s_gpu_temperature_celsius" not in scrape and "hvdk8s_gpu_power_watts" not in scrape
    assert log == [
        "hvdk8s[rank 1]: GPU 1: reading hvdk8s_gpu_temperature_celsius failed (NVML: GPU is lost); skipping it this scrape",
        "hvdk8s[rank 1]: GPU 1 does not report hvdk8s_gpu_power_watts (NVML: Not Supported); leaving it out",
    ]


def test_nvml_gpu_chosen_by_uuid_in_cuda_visible_devices(nvml_stub: Path) -> None:
    scrapes, _ = probe(nvml_stub, local_rank=0, cvd="GPU-stub-0")
    assert scrapes[0]["hvdk8s_gpu_utilization_ratio"][0].labels["gpu"] == "GPU-stub-0"
    assert only(scrapes[0], "hvdk8s_gpu_temperature_celsius") == 61
    scrapes, log = probe(nvml_stub, local_rank=0, cvd="GPU-gone")
    assert scrapes == []
    assert log == ["hvdk8s[rank 0]: GPU telemetry off: NVML cannot open GPU GPU-gone (Not Found); training metrics are still exported"]


def test_nvml_init_error_turns_telemetry_off_once(nvml_stub: Path) -> None:
    driver_not_loaded = str(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    scrapes, log = probe(nvml_stub, local_rank=0, STUB_NVML_INIT_RC=driver_not_loaded)
    assert scrapes == []
    assert log == ["hvdk8s[rank 0]: GPU telemetry off: NVML unavailable (Driver Not Loaded); training metrics are still exported"]
    scrapes, log = probe(nvml_stub, local_rank=1, STUB_NVML_INIT_RC=driver_not_loaded)
    assert scrapes == [] and log == []  # host-wide news: local rank 0 says it


# --------------------------------------------------------------------------- a real 2-rank job


def free_port_pair() -> int:
    """A base port such that base and base + 1 are free right now, from 25000-32767: below the ephemeral port range
    (32768 up), so no other process's ``bind(0)`` or outgoing connection takes one before the ranks bind them
    seconds later, and above portpicker's 15000-24999, which the TF Serving peer tests draw from."""
    for _ in range(100):
        base = random.randrange(25000, 32767 - 1)
        if portpicker.is_port_free(base) and portpicker.is_port_free(base + 1):
            return base
    raise RuntimeError("no two consecutive free ports in 25000-32767")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("obs")
    base = free_port_pair()
    env = {**os.environ, "HVDK8S_METRICS_PORT": str(base), "HVDK8S_JOB_NAME": "obs-test"}
    argv = [sys.executable, "-m", "hvdk8s.cli", "run", "-np", "2", "--timeline", str(out / "timeline.json"),
            str(SCRIPT), str(out), "--epochs", str(EPOCHS), "--tensorboard", str(out / "tb")]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 150
        while not all((out / f"ready.{r}.json").exists() for r in (0, 1)):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "ranks did not finish training in time"
            time.sleep(0.2)
        ready = [json.loads((out / f"ready.{r}.json").read_text()) for r in (0, 1)]
        scrapes = [
            samples(urllib.request.urlopen(f"http://127.0.0.1:{base + r}/metrics", timeout=10).read().decode())
            for r in (0, 1)
        ]
        (out / "release").touch()
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    return {"out": out, "base": base, "ready": ready, "scrapes": scrapes, "output": output.splitlines()}


def test_every_rank_serves_on_base_port_plus_local_rank(job: dict) -> None:
    assert [r["port"] for r in job["ready"]] == [job["base"], job["base"] + 1]


def test_rank_metrics_carry_job_rank_local_rank_and_host_labels(job: dict) -> None:
    for rank, scrape in enumerate(job["scrapes"]):
        expected = {"job": "obs-test", "rank": str(rank), "local_rank": str(rank), "host": socket.gethostname()}
        for name in ("hvdk8s_examples_total", "hvdk8s_steps_total", "hvdk8s_examples_per_second",
                     "hvdk8s_step_seconds_sum", "hvdk8s_allreduce_seconds_sum", "hvdk8s_loss", "hvdk8s_epoch"):
            assert scrape[name][0].labels == expected, name


def test_rank_metric_values_are_those_of_the_run(job: dict) -> None:
    steps = EPOCHS * STEPS_PER_EPOCH
    for scrape in job["scrapes"]:
        assert only(scrape, "hvdk8s_steps_total") == steps
        assert only(scrape, "hvdk8s_examples_total") == steps * BATCH  # counted by Keras's loss tracker
        assert only(scrape, "hvdk8s_examples_per_second") > 0
        assert only(scrape, "hvdk8s_step_seconds_count") == steps
        assert only(scrape, "hvdk8s_allreduce_seconds_count") == steps
        assert 0 < only(scrape, "hvdk8s_allreduce_seconds_sum") <= only(scrape, "hvdk8s_step_seconds_sum")
        assert only(scrape, "hvdk8s_epoch") == only(scrape, "hvdk8s_epochs") == EPOCHS
        assert 0 < only(scrape, "hvdk8s_loss") < 5
        assert only(scrape, "hvdk8s_last_step_timestamp_seconds") > time.time() - 600


def test_rank_0_alone_exports_the_job_aggregate_equal_to_the_epoch_logs(job: dict) -> None:
    chief, worker = job["scrapes"]
    history = job["ready"][0]["history"]
    assert history == job["ready"][1]["history"]  # the job figures come from one allreduce
    assert only(chief, "hvdk8s_job_ranks") == 2
    for key in ("examples_per_second", "step_seconds", "allreduce_seconds", "loss"):
        assert only(chief, f"hvdk8s_job_{key}") == history[key][-1], key
        assert chief[f"hvdk8s_job_{key}"][0].labels == {"job": "obs-test"}
    assert history["examples_per_second"][-1] > 0
    assert 0 < history["allreduce_seconds"][-1] <= history["step_seconds"][-1]
    assert not [name for name in worker if name.startswith("hvdk8s_job_")]


def test_without_gpu_there_are_no_gpu_metrics_and_nothing_said_about_them(job: dict) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this host has libnvidia-ml: a CPU machine without it is what this checks")
    for scrape in job["scrapes"]:
        assert not [name for name in scrape if name.startswith("hvdk8s_gpu_")]
    assert not [line for line in job["output"] if "GPU" in line]


def test_progress_bar_only_on_rank_0_one_line_per_refresh(job: dict) -> None:
    bars = [line for line in job["output"] if "Epoch " in line]
    assert bars and all(line.startswith("[0] Epoch ") for line in bars)
    finals = [line for line in bars if f"{STEPS_PER_EPOCH}/{STEPS_PER_EPOCH}" in line]
    assert [line.split(":")[0] for line in finals] == [f"[0] Epoch {e}/{EPOCHS}" for e in range(1, EPOCHS + 1)]
    assert "examples_per_second=" in finals[-1] and "loss=" in finals[-1]


def test_tensorboard_events_only_from_rank_0(job: dict) -> None:
    events = list((job["out"] / "tb").rglob("events.out.tfevents.*"))
    assert events
    pids = {int(re.search(r"\.(\d+)\.\d+\.v2$", path.name).group(1)) for path in events}  # ...<host>.<pid>.<n>.v2
    assert pids == {job["ready"][0]["pid"]}
    assert b"epoch_examples_per_second" in b"".join(p.read_bytes() for p in events)


def test_horovod_timeline_is_chrome_trace_json_with_the_gradient_allreduce(job: dict) -> None:
    trace = json.loads((job["out"] / "timeline.json").read_text())
    assert isinstance(trace, list) and all("ph" in event for event in trace)
    lanes = {e["args"]["name"] for e in trace if e.get("name") == "process_name" and "name" in e.get("args", {})}
    assert any("Distributed" in lane for lane in lanes), lanes  # DistributedOptimizer names its allreduces
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= {e.get("name") for e in trace if e["ph"] == "B"}


def test_each_epoch_end_is_one_allreduce_of_the_logs_and_the_job_figures(job: dict) -> None:
    # MetricAverageCallback's grouped allreduce carries the loss and TrainingMetrics's three figures:
    # one 4-tensor group per epoch, not the logs' group plus a second one for the figures.
    trace = json.loads((job["out"] / "timeline.json").read_text())
    lanes = {e["pid"]: e["args"].get("name", "") for e in trace if e.get("name") == "process_name"}
    grouped = Counter(
        lanes.get(event.get("pid"), "") for event in trace if event["ph"] == "B" and event.get("name") == "ALLREDUCE"
    )
    assert {name: n for name, n in grouped.items() if name.startswith("HorovodGroupedAllreduce")} == {
        f"HorovodGroupedAllreduce_{i}of4": EPOCHS for i in range(1, 5)
    }
