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
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    final, tmp = run_dir / FILE, run_dir / (FILE + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(final)
    return final


def load(path: str | Path) -> Checkpoint:
    """Read a checkpoint from a run directory (or the file itself), without pickle."""
    path = Path(path).expanduser()
    file = path / FILE if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"train.resume={path}: no {FILE} there (nothing to resume)")
    try:
        with np.load(file, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            theta = np.array(z["theta"], dtype=np.float32)
            step = int(z["step"])
            opt = {k[4:]: np.array(z[k]) for k in z.files if k.startswith("opt.")}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise CheckpointError(
            f"train.resume={path}: {file} is not a readable checkpoint: {e}"
        ) from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{file}: checkpoint format {meta.get('format')} is not {FORMAT}")
    return Checkpoint(step=step, theta=theta, optimizer=opt, meta=meta)
