"""Cache keys and checkpoint identity: the one way to key an artifact.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: Bytes read at a time when hashing a file (`file_sha256`)
_HASH_BLOCK = 1 << 24
#: sha256 of files already hashed in this process, by (path, inode, size, mtime_ns, ctime_ns): the key is the
#: bytes' hash; the stat only says when it must be taken again (any write changes ctime, which utime cannot set back)
_HASHED: dict[tuple[str, int, int, int, int], str] = {}


def config_hash(data: Any) -> str:
    """sha256 of the canonical JSON of ``data`` (hex)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def cache_key(job: str, version: int, **inputs: Any) -> str:
    """The key of a cached artifact: 16 hex characters of `config_hash` over the name of
    the job that produces it, the job's ``version`` and every input it reads (config
    sections as ``model_dump(mode="json")``, checkpoints as `checkpoint_identity`).
    The one way to key an artifact: the prepared teacher and student, the refined
    teacher, a converted or derived model (`distillab.models.sources`), an OffPD rollout
    set and the pre-distillation evaluation. Bump ``version``
    when the job's code changes what it produces; a changed key reruns the job (no
    compatibility with older keys)."""
    return config_hash({"job": job, "version": version, "inputs": inputs})[:16]


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of the bytes of the file ``path``, read in 16 MiB blocks (~0.3 s for a
    90 MB GGUF file). Taken once per process for a file whose inode, size, mtime and ctime
    have not changed since (the stat only decides when to hash again; the value is the bytes' hash).

    Raises:
        OSError: the file cannot be read."""
    path = Path(path).resolve()
    st = path.stat()
    memo = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if memo not in _HASHED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(_HASH_BLOCK):
                h.update(block)
        _HASHED[memo] = h.hexdigest()
    return _HASHED[memo]


def checkpoint_identity(path: str | Path) -> list:
    """What stands for a checkpoint in a `cache_key`.

    - a single file (a GGUF file): ``["sha256", <hex>]``, its bytes' hash (`file_sha256`):
      the same file under another name or path keeps its key, a replaced file gets a new one;
    - a directory: name, size and mtime of each of its files, after its absolute path (a
      cheap stand-in for its contents: hashing an 8B checkpoint's 16 GB per key is not;
      the directories `prepare` writes are named by their content keys);
    - a missing path: its absolute path alone."""
    path = Path(path).resolve()
    if path.is_file():
        return ["sha256", file_sha256(path)]
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return [str(path)] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def content_identity(path: str | Path, skip: tuple[str, ...] = ()) -> list:
    """The contents of a checkpoint directory for a `cache_key`: ``[name, sha256]`` of each
    of its files (sorted by name, those named in ``skip`` left out), or `checkpoint_identity`
    of a single file. Reads every byte (an 8B checkpoint: ~16 GB), once per process."""
    path = Path(path).resolve()
    if not path.is_dir():
        return checkpoint_identity(path)
    return [[f.name, file_sha256(f)] for f in sorted(path.iterdir()) if f.is_file() and f.name not in skip]
