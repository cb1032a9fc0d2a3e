"""What checkpoints hold and how they are read: numpy arrays and scalars stored as tagged tensors (`encode` /
`decode`), so that `torch.load(weights_only=True)` reads every checkpoint and loading a file never runs code; the
process's RNG states."""

from __future__ import annotations

import os
import random
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from amago_app.rundir.atomic_writes import atomic_write_bytes
from amago_app.rundir.errors import RunDirError

if TYPE_CHECKING:
    import torch
# torch is imported where checkpoints are read or written, so that commands reading a run's text files
# (amago-plot) start without it


_ND = "__ndarray__"


def encode(obj: Any, where: str = "state") -> Any:
    """numpy arrays and scalars -> tagged tensors / Python scalars (recursively), so `weights_only=True` reads them.

    Anything that is not a tensor, array or plain value is refused here, when the state is written.
    """
    import torch

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
    """Inverse of `encode` (same dtypes, shapes and bytes)."""
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


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """`torch.load(weights_only=True)` + `decode`; an unreadable file raises RunDirError naming it."""
    import torch

    path = Path(path)
    try:
        return decode(torch.load(path, map_location=map_location, weights_only=True))
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated zip, foreign pickle, refused global: all mean "not ours"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if path.is_file() and path.stat().st_size == 0:
            reason = "the file is empty"
        if "Weights only load failed" in str(e) or "weights_only" in str(e):
            reason = "it holds objects other than tensors and plain values (refused: loading them could run code)"
        raise RunDirError(f"cannot read checkpoint {path}: {reason}") from e


def state_dict_differences(saved: dict, current: dict, limit: int = 3) -> str:
    """What keeps `saved` from loading into a module whose state dict is `current`, in one short line: tensors
    of another shape, tensors only one side has (at most `limit` of each named)."""
    def shape(v):
        return list(v.shape) if hasattr(v, "shape") else type(v).__name__

    reshaped = [f"{k} {shape(v)} saved, {shape(current[k])} now" for k, v in saved.items()
                if k in current and shape(v) != shape(current[k])]
    only_saved = [k for k in saved if k not in current]
    only_now = [k for k in current if k not in saved]
    parts = []
    for label, items in (("different shapes", reshaped), ("only in the saved weights", only_saved),
                         ("not in the saved weights", only_now)):
        if items:
            more = f" and {len(items) - limit} more" if len(items) > limit else ""
            parts.append(f"{len(items)} with {label}: {', '.join(items[:limit])}{more}" if label == "different shapes"
                         else f"{len(items)} {label}: {', '.join(items[:limit])}{more}")
    return "; ".join(parts) or "the tensors match"


def intact(path: str | os.PathLike) -> bool:
    """Whether a checkpoint file is a complete torch zip archive (every member's CRC checks out)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    """Write `obj` (encoded for `weights_only=True` reading) atomically."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = encode(obj)
    atomic_write_bytes(path, lambda f: torch.save(data, f))


def rng_state() -> dict:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
