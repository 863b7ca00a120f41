"""GPU clocks, temperature, power, utilisation and throttle reasons through NVML (nvidia-ml-py).

Imported only on machines with an NVIDIA driver (see :func:`cuda_present`), so a
CPU machine never loads an NVIDIA library.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

__all__ = ["GpuReader", "cuda_present"]

log = logging.getLogger(__name__)


def cuda_present() -> bool:
    """True when an NVIDIA driver is present (``/proc/driver/nvidia`` or ``/dev/nvidia0``); loads nothing."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")


class GpuReader:
    """Reads one GPU's state through NVML.

    Args:
        uuid: The GPU's UUID (``torch.cuda.get_device_properties(i).uuid``), so the
            right physical GPU is read whatever ``CUDA_VISIBLE_DEVICES`` says.

    Raises:
        ImportError: nvidia-ml-py is not installed.
        Exception: NVML failed to initialise or to find the GPU (``pynvml.NVMLError``).
    """

    def __init__(self, uuid: str) -> None:
        import pynvml

        self._nvml: Any = pynvml
        pynvml.nvmlInit()
        name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(name)
        self._reasons = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def read(self) -> tuple[int, float, float, float, int]:
        """``(sm_clock_mhz, temp_c, power_w, util_pct, throttle_reasons)``; zeros for what fails."""
        nv, h = self._nvml, self._handle
        out: list[Any] = [0, 0.0, 0.0, 0.0, 0]
        calls: tuple[Callable[[], float], ...] = (
            lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            lambda: int(self._reasons(h)),
        )
        for i, call in enumerate(calls):
            try:
                out[i] = call()
            except Exception:
                log.debug("argus: NVML read %d failed", i, exc_info=True)
        return (int(out[0]), float(out[1]), float(out[2]), float(out[3]), int(out[4]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
