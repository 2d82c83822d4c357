"""Tiny models for the benchmarks' ``--plumbing`` runs (shared by the scripts; not a benchmark itself).

A plumbing run takes a benchmark's whole path (arguments, configuration, models, every timed
part, the printed table) on models of a few thousand parameters for a few steps, so that a fast
test runs it in seconds and a benchmark cannot rot between the days it is measured. Its numbers
mean nothing and are never quoted.

`tiny_models` writes a random-weight micro teacher and student (the character tokenizer with its
chat template, one layer of width 32) as prepared model directories; a sweep names them with
``models.teacher_path`` / ``models.student_path`` (`plumbing_sets`), which ``prepare`` returns as
they are, so nothing is trained.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from distillab.models import build_char_tokenizer, micro_llama_config

REPO = Path(__file__).resolve().parents[1]
#: the sweep a plumbing run configures (its models replaced by `tiny_models`)
CONFIG = str(REPO / "search_spaces" / "smoke.yaml")


def tiny_models(root: str | Path) -> tuple[Path, Path]:
    """``(teacher_dir, student_dir)`` under ``root``: random-weight one-layer micro Llamas (hidden 32,
    one head) with the character tokenizer, saved as safetensors (created once; reused if present)."""
    tok = build_char_tokenizer()
    paths = []
    for seed, role in enumerate(("teacher", "student")):
        out = Path(root) / f"tiny-{role}"
        if not (out / "model.safetensors").exists():
            torch.manual_seed(seed)
            model = LlamaForCausalLM(micro_llama_config(len(tok), 32, 1, 1, 32, 128, tok))
            model.save_pretrained(out, safe_serialization=True)
            tok.save_pretrained(out)
        paths.append(out)
    return paths[0], paths[1]


def plumbing_sets(root: str | Path) -> dict[str, str]:
    """The sweep overrides that make a benchmark's config use `tiny_models` under ``root``."""
    teacher, student = tiny_models(root)
    return {"models.teacher_path": str(teacher), "models.student_path": str(student)}
