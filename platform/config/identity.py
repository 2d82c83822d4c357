"""Cache keys and checkpoint identity: the one way to key an artifact.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def config_hash(data: Any) -> str:
    """sha256 of the canonical JSON of ``data`` (hex)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def cache_key(job: str, version: int, **inputs: Any) -> str:
    """The key of a cached artifact: 16 hex characters of `config_hash` over the name of
    the job that produces it, the job's ``version`` and every input it reads (config
    sections as ``model_dump(mode="json")``, checkpoints as `checkpoint_identity`).
    The one way to key an artifact: the prepared teacher and student, the refined
    teacher, an OffPD rollout set and the pre-distillation evaluation. Bump ``version``
    when the job's code changes what it produces; a changed key reruns the job (no
    compatibility with older keys)."""
    return config_hash({"job": job, "version": version, "inputs": inputs})[:16]


def checkpoint_identity(path: str | Path) -> list:
    """Name, size and mtime of each file of a checkpoint directory, after its absolute
    path: a cheap stand-in for its contents in a `cache_key` (hashing 8B weights is not)."""
    path = Path(path).resolve()
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return [str(path)] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
