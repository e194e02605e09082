"""DLPack hand-off between torch and CuPy: views of the same device memory, never copies, and
launches on torch's current stream so kernel and torch work stay ordered."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["as_cupy", "as_torch", "torch_stream", "require"]


def require(tensor: torch.Tensor, name: str, dtype: torch.dtype, *, shape: tuple | None = None) -> torch.Tensor:
    """Check a kernel argument: on CUDA, ``dtype``, C-contiguous, and ``shape`` when given."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cuda":
        raise ValueError(f"{name} is on {tensor.device}, the kernel needs a CUDA tensor")
    if tensor.dtype != dtype:
        raise ValueError(f"{name} is {tensor.dtype}, the kernel needs {dtype}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} is not contiguous")
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    return tensor


def as_cupy(tensor: torch.Tensor):
    """A CuPy array over the tensor's memory (DLPack; no copy)."""
    import cupy

    return cupy.from_dlpack(tensor.detach())


def as_torch(array) -> torch.Tensor:
    """A torch tensor over a CuPy array's memory (DLPack; no copy)."""
    return torch.from_dlpack(array)


@contextlib.contextmanager
def torch_stream(device: torch.device | None = None) -> Iterator[None]:
    """Run CuPy launches on torch's current CUDA stream (and device)."""
    import cupy

    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(stream.device.index or 0), cupy.cuda.ExternalStream(stream.cuda_stream):
        yield
