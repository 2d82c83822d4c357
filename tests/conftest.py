"""Test environment: offline, no tokenizer threads, Ray Train V2, CPU DeepSpeed, and
every cache/temporary directory under ``<repo>/.cache/`` (never the system /tmp).

Set at import time, before any test module imports torch/transformers/ray.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

for _var, _sub in (
    ("TMPDIR", "tmp"),
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
):
    _dir = CACHE / _sub
    _dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(_var, str(_dir))

# tempfile caches its directory on first use; make it re-read TMPDIR.
tempfile.tempdir = None
