"""Small helpers shared by test modules (tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

import torch


class EngineStandIn(torch.nn.Module):
    """Stands in for the DeepSpeed engine in `loss.loss_step`: ``engine(...)``
    forwards, ``engine.module`` is the model."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kw):
        return self.module(**kw)
