"""Ops tests: without CUDA, the Triton kernels run under the interpreter.

Triton decides between compiled and interpreted kernels when ``distillab.ops.triton_kl``
is imported, so the variable is set here, before any test module imports it.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
