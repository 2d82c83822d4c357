"""The held-out prose scores of the pretrained OOD suite (``evaluation.ood_backend: pretrained``,
`distillab.evals.prose`) of a sweep's prepared teacher and student, before any training: per model
the rows ``ood/prose`` ``loss`` (nats/token) and ``next_token_accuracy`` with their ``n`` (scored
tokens), float32, under the sweep's ``trial.evaluation.prose`` (the defaults where the sweep uses
another OOD backend).

    distillab prepare search_spaces/smol.yaml
    python scripts/prose_ood.py search_spaces/smol.yaml
    python scripts/prose_ood.py search_spaces/smol_smoke.yaml --set trial.evaluation.prose.documents=2

Prints a Markdown table, one row per role; a model not prepared yet is an error naming it.
"""

from __future__ import annotations

import argparse
import time

import torch

from distillab.config import ProseConfig, load_sweep
from distillab.driver.cli import parse_overrides
from distillab.evals.prose import prose_documents, prose_rows
from distillab.models import load_model, load_tokenizer
from distillab.recipe.prepare import model_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", help="a sweep YAML whose models `distillab prepare` has prepared")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a sweep field")
    args = ap.parse_args()
    sweep = load_sweep(args.sweep, parse_overrides(args.set))
    cfg = sweep.trial.evaluation.prose or ProseConfig()
    texts = prose_documents(cfg.documents)
    print(f"{len(texts)} held-out documents; {cfg}; {torch.get_num_threads()} threads\n")
    print("| model | loss (nats/token) | next-token accuracy | tokens | seconds |\n|---|---|---|---|---|")
    for role in ("teacher", "student"):
        path = model_dir(sweep, role)
        if not (path / "config.json").exists():
            raise SystemExit(f"models.{role}: {path} is not prepared: run `distillab prepare {args.sweep}` first")
        model, tok = load_model(path).eval(), load_tokenizer(path)
        start = time.perf_counter()
        loss, acc = prose_rows(model, tok, texts, cfg)
        print(f"| {role} | {loss['value']:.3f} | {acc['value']:.3f} | {loss['n']} | "
              f"{time.perf_counter() - start:.1f} |")


if __name__ == "__main__":
    main()
