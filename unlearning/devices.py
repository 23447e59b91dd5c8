"""Device resolution, defined once: "auto" (or None) is CUDA when present, else CPU."""

from __future__ import annotations

import torch


class DeviceUnavailable(ValueError):
    """CUDA was asked for explicitly on a machine without it."""


def resolve_device(device: str | torch.device | None, what: str = "device") -> torch.device:
    """`what` names the setting in the error (e.g. "base.device")."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"{what} = {str(device)!r} but no CUDA device is available; use 'auto' or 'cpu'")
    return dev
