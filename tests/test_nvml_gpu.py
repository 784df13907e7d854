"""What hvdk8s reads through NVML from a real NVIDIA GPU, against nvidia-smi's readings: the telemetry collector's
gauges under a known load, and ``hvdk8s doctor``'s driver and GPU names.

``test_observability`` drives the collector through the real pynvml bindings against a stub NVML; this module
reads a real GPU and so runs only where NVML finds one (it skips, naming why, everywhere else, CI included). It
imports neither TensorFlow nor Keras, so it also runs on a GPU machine that has only PyTorch: a PyTorch process
is the load (a known amount of GPU memory held, matrix products back to back), and nvidia-smi, NVIDIA's own
reader, gives the figures hvdk8s must agree with.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hvdk8s import doctor
from hvdk8s.observe import telemetry

HOLD_GIB = 16  # GPU memory the load process holds, beside what its matrix products use
LABELS = {"job": "gpu-check", "rank": "0"}

LOAD = f"""
import sys, torch
held = torch.empty({HOLD_GIB} << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = a @ a
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
"""


def _gpu_count() -> int:
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        pytest.skip(f"no NVIDIA GPU here (NVML: {err})")


@pytest.fixture(scope="module")
def nvidia() -> None:
    """Skips unless NVML finds a GPU and nvidia-smi, the reference reader, is there."""
    if _gpu_count() < 1:
        pytest.skip("NVML finds no GPU")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi (the reference reader) is not on PATH")


@pytest.fixture(scope="module")
def gpu_load(nvidia: None) -> Iterator[None]:
    """GPU 0 busy with matrix products while holding HOLD_GIB GiB, until the module's tests are done."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch (the GPU load) is not installed")
    load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    try:
        assert load.stdout is not None and load.stdout.readline().strip() == "ready", "the GPU load did not start"
        time.sleep(3)  # NVML's utilisation covers its last sample period (up to a second): let it fill with work
        yield
    finally:
        load.kill()
        load.wait()


SMI_FIELDS = ["uuid", "name", "driver_version", "memory.total", "memory.used", "temperature.gpu", "power.draw",
              "utilization.gpu"]


def smi(gpu: str | None = None) -> list[dict[str, str]]:
    """nvidia-smi's reading of one GPU (index or UUID), or of every GPU, by query field."""
    out = subprocess.run(["nvidia-smi", *([f"--id={gpu}"] if gpu else []), f"--query-gpu={','.join(SMI_FIELDS)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    return [dict(zip(SMI_FIELDS, (v.strip() for v in line.split(",")))) for line in out.strip().splitlines()]


def scrape(cuda_visible_devices: str | None) -> tuple[dict[str, float], set[str]]:
    """One Prometheus scrape of the collector for local rank 0, parsed back: {metric: value}, and the gpu labels."""
    collector = telemetry.gpu_telemetry(LABELS, rank=0, local_rank=0, cuda_visible_devices=cuda_visible_devices)
    assert collector is not None
    registry = CollectorRegistry()
    registry.register(collector)
    samples = [s for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples]
    assert all({k: v for k, v in s.labels.items() if k != "gpu"} == LABELS for s in samples)
    return {s.name: s.value for s in samples}, {s.labels["gpu"] for s in samples}


def test_readings_of_a_busy_gpu_agree_with_nvidia_smi(gpu_load: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hvdk8s"):
        values, gpus = scrape(None)
    [reference] = smi("0")
    assert gpus == {"0"}
    assert set(values) == set(telemetry.READINGS), caplog.text  # a data-centre GPU reports all five
    assert not caplog.text
    mib = 2**20
    assert abs(values["hvdk8s_gpu_memory_total_bytes"] / mib - float(reference["memory.total"])) <= 1
    assert values["hvdk8s_gpu_memory_used_bytes"] >= HOLD_GIB << 30
    # nvidia-smi rounds to MiB and leaves the driver's reserve out of "used" (615 MiB on an H200), as the gauge does
    assert abs(values["hvdk8s_gpu_memory_used_bytes"] / mib - float(reference["memory.used"])) <= 16
    assert values["hvdk8s_gpu_utilization_ratio"] >= 0.9, "GPU 0 runs matrix products back to back"
    assert float(reference["utilization.gpu"]) >= 90
    assert abs(values["hvdk8s_gpu_temperature_celsius"] - float(reference["temperature.gpu"])) <= 5
    assert 0 < values["hvdk8s_gpu_power_watts"] <= 2000
    assert abs(values["hvdk8s_gpu_power_watts"] - float(reference["power.draw"])) <= 0.5 * float(reference["power.draw"])


def test_gpu_pinned_by_uuid_reads_the_same_board(gpu_load: None) -> None:
    [reference] = smi("0")
    uuid = reference["uuid"]
    by_index, _ = scrape("0")
    by_uuid, gpus = scrape(uuid)
    assert gpus == {uuid}
    assert by_uuid["hvdk8s_gpu_memory_total_bytes"] == by_index["hvdk8s_gpu_memory_total_bytes"]
    assert by_uuid["hvdk8s_gpu_memory_used_bytes"] >= HOLD_GIB << 30
    # the board the load runs on: the same memory in use as by index (the load's products allocate nothing new)
    assert abs(by_uuid["hvdk8s_gpu_memory_used_bytes"] - by_index["hvdk8s_gpu_memory_used_bytes"]) <= 64 << 20


def test_doctor_names_the_driver_and_the_gpus_nvidia_smi_names(nvidia: None) -> None:
    boards = smi()
    facts = doctor.gather()
    assert facts.nvml.error is None
    assert facts.nvml.driver == boards[0]["driver_version"]
    assert facts.nvml.gpus == [board["name"] for board in boards]
    assert f"driver {boards[0]['driver_version']}: {boards[0]['name']}" in "\n".join(doctor.report(facts))
