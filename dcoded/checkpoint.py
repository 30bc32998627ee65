"""Checkpoints: the parameters, the optimizer state, the step; a plain ``.npz`` (never
unpickled as objects), written to a temporary name and renamed, so a crash leaves the previous
checkpoint whole.

Optimizer state is stored full-length (every shard's tensors concatenated in segment order):
SGD's momentum and Adam's moments are elementwise, so a run can resume with another number of
workers, redundancy or group size, and the state is re-sliced for the new segments. Resuming
with the same layout ends bit for bit where the uninterrupted run ends (``asgd`` excepted: its
order of updates is not deterministic). The sample order needs no saved random state: it is a
function of ``(train.seed, epoch)``.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dcoded import files
from dcoded.errors import CheckpointError

FILE = "checkpoint.npz"
FORMAT = 1


@dataclass
class Checkpoint:
    step: int  # the number of steps done: the next step to run
    theta: np.ndarray
    optimizer: dict[str, np.ndarray]  # name -> full-length tensor, or a scalar
    meta: dict


def slice_state(state: dict[str, np.ndarray] | None, segment: slice) -> dict[str, np.ndarray]:
    """The optimizer state of one segment: full-length tensors sliced, scalars kept."""
    return {k: (v[segment] if np.ndim(v) == 1 else v) for k, v in (state or {}).items()}


def concat_shards(shards: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Shard states in segment order -> full-length state (vectors joined, scalars from shard 0;
    every shard steps together, so their scalars agree)."""
    if not shards or not shards[0]:
        return {}
    out = {}
    for name, first in shards[0].items():
        out[name] = np.concatenate([s[name] for s in shards]) if first.ndim == 1 else first
    return out


def save(run_dir: Path, ckpt: Checkpoint) -> Path:
    """Write ``run_dir/checkpoint.npz`` atomically; refuse non-finite parameters."""
    if not np.all(np.isfinite(ckpt.theta)):
        raise CheckpointError(f"refusing to checkpoint non-finite parameters at step {ckpt.step}")
    run_dir.mkdir(parents=True, exist_ok=True)
    arrays = {"theta": np.asarray(ckpt.theta, "<f4"), "step": np.int64(ckpt.step)}
    arrays |= {f"opt.{k}": np.asarray(v) for k, v in ckpt.optimizer.items()}
    meta = {"format": FORMAT, **ckpt.meta}
    arrays["meta"] = np.frombuffer(json.dumps(meta, default=str).encode(), dtype=np.uint8)
    return files.replace(run_dir / FILE, lambda f: np.savez(f, **arrays), "wb")


#: The most float32 values a checkpoint's ``theta`` (and each optimizer tensor) may hold:
#: read from each member's header before any is read, so a crafted ``.npz`` cannot make
#: every process decompress gigabytes.
MAX_PARAMS = 1 << 30


def _check_members(file: Path, where) -> None:
    """Each member's shape and dtype from its ``.npy`` header, before anything is read:
    ``theta`` a float32 vector of at most :data:`MAX_PARAMS`, ``step`` a scalar, each
    optimizer tensor a scalar or as long as ``theta``."""
    with zipfile.ZipFile(file) as z:
        headers = {}
        for info in z.infolist():
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            headers[info.filename.removesuffix(".npy")] = (shape, dtype)
    theta = headers.get("theta")
    if theta is None or len(theta[0]) != 1 or theta[1] != np.dtype("<f4"):
        raise CheckpointError(f"train.resume={where}: {file} has no float32 vector theta")
    n = theta[0][0]
    if n > MAX_PARAMS:
        raise CheckpointError(
            f"train.resume={where}: {file} claims {n:,} parameters (at most {MAX_PARAMS:,})"
        )
    for name, (shape, _) in headers.items():
        if name.startswith("opt.") and shape not in ((), (1,), (n,)):
            raise CheckpointError(
                f"train.resume={where}: {file}: optimizer state {name[4:]} has shape {shape}, "
                f"neither a scalar nor one value per parameter ({n:,})"
            )


def load(path: str | Path) -> Checkpoint:
    """Read a checkpoint from a run directory (or the file itself), without pickle; every
    member's header is checked before any is read (:func:`_check_members`)."""

    def read(z) -> tuple:
        theta = np.array(z["theta"], dtype=np.float32)
        return theta, {k[4:]: np.array(z[k]) for k in z.files if k.startswith("opt.")}

    step, meta, (theta, opt) = _read(path, read)
    return Checkpoint(step=step, theta=theta, optimizer=opt, meta=meta)


def peek(path: str | Path) -> tuple[int, dict]:
    """A checkpoint's step and ``meta`` (its run's config among them), checked as :func:`load`
    checks them, without reading its parameters or optimizer state; :class:`CheckpointError`
    where there is none to read."""
    step, meta, _ = _read(path, lambda z: None)
    return step, meta


def _read(path: str | Path, more) -> tuple[int, dict, object]:
    """``(step, meta, more(z))`` of the checkpoint at ``path`` (a run directory or the file),
    every member's header checked first; one :class:`CheckpointError` line where it cannot be."""
    path = Path(path).expanduser()
    file = path / FILE if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"train.resume={path}: no {FILE} there (nothing to resume)")
    try:
        _check_members(file, path)
        with np.load(file, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            step = int(z["step"])
            extra = more(z)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise CheckpointError(
            f"train.resume={path}: {file} is not a readable checkpoint: {e}"
        ) from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{file}: checkpoint format {meta.get('format')} is not {FORMAT}")
    if step < 0:
        raise CheckpointError(f"train.resume={path}: {file} is at step {step}, below 0")
    return step, meta, extra
