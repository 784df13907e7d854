"""GPU telemetry from NVML as a Prometheus collector, read at scrape time.

Reading at scrape time means no sampling thread and no cost between scrapes.
Telemetry is best effort: without the NVML library, a driver or a GPU the
collector is simply not created, and a reading a GPU does not support (power
on many boards) is left out. Each condition but the first (a machine without
NVIDIA's driver library has no GPU to watch) is logged once; none can raise
into training or fail a scrape. ``tests/test_nvml_gpu.py`` checks the
readings against nvidia-smi's on a real GPU.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import pynvml
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hvdk8s.observe.ranklog import log_once

Reading = Callable[[object], float]


def _memory(handle: object) -> Any:
    """NVML's version-2 memory figures: version 1's ``used`` also counts the driver's reserve (615 MiB on an
    H200), so it reads higher than nvidia-smi's. Version 2 needs driver 510 or later, which the CUDA 12 that
    TensorFlow 2.18-2.21 are built with requires anyway."""
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)


# name -> (help, NVML reading in the exported unit)
READINGS: Mapping[str, tuple[str, Reading]] = {
    "hvdk8s_gpu_utilization_ratio": (
        "Fraction of the last sample period in which a kernel ran on the GPU (NVML).",
        lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
    ),
    "hvdk8s_gpu_memory_used_bytes": (
        "GPU memory allocated, all processes; the driver's reserve left out, as in nvidia-smi (NVML).",
        lambda h: float(_memory(h).used),
    ),
    "hvdk8s_gpu_memory_total_bytes": (
        "GPU memory installed (NVML).",
        lambda h: float(_memory(h).total),
    ),
    "hvdk8s_gpu_temperature_celsius": (
        "GPU core temperature (NVML).",
        lambda h: float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
    ),
    "hvdk8s_gpu_power_watts": (
        "GPU board power draw (NVML).",
        lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
    ),
}


def pinned_device(cuda_visible_devices: str | None, count: int, local_rank: int) -> str | None:
    """The NVML index or UUID of the GPU this rank trains on, or None.

    Mirrors ``hvdk8s.init()``: TensorFlow sees the GPUs listed in
    ``CUDA_VISIBLE_DEVICES`` (all when unset; the list ends at ``-1`` or an
    index out of range, as CUDA does) and each rank takes number
    ``local_rank``. ``init()`` refuses more ranks on a host than GPUs; a
    process that did not call it and has a local rank beyond them is
    reported on ``local_rank % visible``.
    """
    if cuda_visible_devices is None:
        visible = [str(i) for i in range(count)]
    else:
        visible = []
        for entry in (e.strip() for e in cuda_visible_devices.split(",")):
            if not entry or (entry.lstrip("-").isdigit() and not 0 <= int(entry) < count):
                break
            visible.append(entry)
    return visible[local_rank % len(visible)] if visible else None


class GpuTelemetry(Collector):
    """Gauges for one rank's GPU: utilisation, memory used/total, temperature, power."""

    def __init__(self, handle: object, gpu: str, labels: Mapping[str, str], say: Callable[[str], None]) -> None:
        self._handle = handle
        self._labels = {**labels, "gpu": gpu}
        self._say = say
        self._unsupported: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        for name, (help_text, read) in READINGS.items():
            if name in self._unsupported:
                continue
            try:
                value = read(self._handle)
            except pynvml.NVMLError_NotSupported as err:
                self._unsupported.add(name)
                self._say(f"GPU {self._labels['gpu']} does not report {name} (NVML: {err}); leaving it out")
                continue
            except pynvml.NVMLError as err:
                self._say(f"GPU {self._labels['gpu']}: reading {name} failed (NVML: {err}); skipping it this scrape")
                continue
            family = GaugeMetricFamily(name, help_text, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), value)
            yield family


def gpu_telemetry(
    labels: Mapping[str, str], *, rank: int, local_rank: int, cuda_visible_devices: str | None
) -> GpuTelemetry | None:
    """A collector for this rank's GPU, or None (said once, except on hosts without NVIDIA's driver library)
    when NVML cannot give one.

    CUDA indices in ``CUDA_VISIBLE_DEVICES`` are taken as NVML indices, true
    for identical GPUs (CUDA orders fastest first, NVML by PCI bus).
    """
    say = partial(log_once, rank=rank, local_rank=local_rank)
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError_LibraryNotFound:
        return None  # no NVIDIA driver on this host, so no GPU to watch: a CPU machine, nothing to say
    except pynvml.NVMLError as err:
        say(f"GPU telemetry off: NVML unavailable ({err}); training metrics are still exported", host_wide=True)
        return None
    spec = pinned_device(cuda_visible_devices, count, local_rank)
    if spec is None:
        say("GPU telemetry off: no GPU visible to this process; training metrics are still exported", host_wide=True)
        return None
    try:
        if spec.isdigit():
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(spec))
        else:
            handle = pynvml.nvmlDeviceGetHandleByUUID(spec)
    except pynvml.NVMLError as err:
        say(f"GPU telemetry off: NVML cannot open GPU {spec} ({err}); training metrics are still exported")
        return None
    return GpuTelemetry(handle, spec, labels, say)
