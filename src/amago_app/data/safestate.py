"""Saved state in a form that `torch.load(weights_only=True)` reads, so loading a file never runs code.

`weights_only=True` unpickles only tensors and plain containers (dict, list, tuple, str, int, float, bool,
None). Training state also holds numpy arrays (recorded timesteps, exploration scales, RNG states) and
numpy scalars; `encode` turns them into tagged dicts of tensors and plain values and `decode` restores them
exactly (same dtype, shape and bytes). Anything else (objects, object arrays) is refused at save time, so a
state that cannot be stored safely fails when it is written rather than when it is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_ND = "__ndarray__"


def encode(obj: Any, where: str = "state") -> Any:
    """numpy arrays and scalars -> tagged tensors / Python scalars, recursively."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: numpy object arrays cannot be stored safely")
        raw = np.ascontiguousarray(obj)
        data = torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8) if raw.nbytes else torch.zeros(0, dtype=torch.uint8)
        return {_ND: data, "dtype": raw.dtype.str, "shape": list(raw.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: encode(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(encode(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    raise TypeError(f"{where}: {type(obj).__name__} cannot be stored safely (use arrays, tensors and plain values)")


def decode(obj: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(obj, dict):
        if _ND in obj:
            arr = np.frombuffer(obj[_ND].numpy().tobytes(), dtype=np.dtype(obj["dtype"]))
            return arr.reshape(obj["shape"]).copy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj
