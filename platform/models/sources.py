"""Model sources resolved into Hugging Face directories (DESIGN.md "Model sources").

`config.ModelSource` says where a model comes from; this module turns the real-checkpoint
sources into one cached directory each, which every consumer then reads alone (the checks,
``--dry-run``, `load_model`, the teacher service's lm_head, the vLLM actor, the cache keys):

- ``gguf``: `convert_gguf` dequantises the file to float32 with transformers' GGUF loader
  (``from_pretrained(dir, gguf_file=...)``) and saves ``config.json``, ``model.safetensors``,
  the tokenizer (``tokenizer.json``, its chat template) and ``generation_config.json`` under
  ``<cache_dir>/gguf-<key>``, the key covering the sha256 of the file's bytes (`gguf_dir`);
  before it is published the saved directory is loaded back and its logits checked bitwise
  against the GGUF load on `CHECK_TEXTS`;
- ``derive``: `derive_pruned` writes a depth-pruned copy of the teacher's directory
  (Minitron's depth pruning, Sreenivas et al. 2024, arXiv 2407.14679, §2: the kept layers'
  tensors renamed to 0..k-1 in order, embeddings, final norm and lm_head kept, the rest of
  the directory copied) under ``<cache_dir>/derive-<key>``, the key covering the teacher's
  identity (`derive_base_identity`) and the kept layers (`derive_dir`);
- ``hf``: the directory itself (nothing is written);
- ``micro``: built and trained by `distillab.recipe.prepare`.

A directory appears only once complete (written in a temporary folder beside it, then
renamed; ``prepare.json`` last) and is built once when several processes ask at once
(`build_lock`). `source_header` reads a source's config and tokenizer without any weights
(for the checks and ``--dry-run``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterable

import torch
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from distillab.config import cache_key, checkpoint_identity, content_identity
from distillab.models.load import load_model, load_tokenizer

log = logging.getLogger(__name__)

__all__ = ["CHECK_TEXTS", "PREPARED_FILE", "build_lock", "gguf_dir", "derive_dir", "derive_base_identity",
           "convert_gguf", "derive_pruned", "pruned_config", "check_keep_layers", "source_header", "publish_dir",
           "read_safetensors", "count_params"]

#: The file a prepared directory is complete with (written last; its build record)
PREPARED_FILE = "prepare.json"
#: Texts whose logits `convert_gguf` compares between the GGUF load and the saved directory (a chat-template
#: prompt and plain text, tokenised by the model's own tokenizer, cut to one length: a batch without padding)
CHECK_TEXTS = ("Using the numbers 25, 7 and 3, make 96. Answer inside <answer></answer>.",
               "def add(a, b):\n    return a + b  # the sum, in Python\n")
#: Layer tensors of a decoder-only transformers model: ``model.layers.<i>.<rest>``
_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..+)$")
#: Files of a checkpoint directory that `derive_pruned` writes itself (the rest is copied)
_WEIGHTS = re.compile(r".*\.safetensors$|.*\.safetensors\.index\.json$|pytorch_model.*\.bin(\.index\.json)?$")


def build_lock(out_dir: Path) -> FileLock:
    """The lock held while ``out_dir`` is checked and, if missing, built: ``.<name>.lock``
    beside it (a `filelock.FileLock`, released when its process ends however it ends). Two
    sweeps or test workers that start at once on one machine build each directory once; the
    second waits, then finds it there. Creates the cache folder."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(out_dir.parent / f".{out_dir.name}.lock")


def publish_dir(tmp: Path, out_dir: Path) -> None:
    """Rename the finished folder ``tmp`` to ``out_dir`` (replacing an older one), so that a
    prepared directory exists only once complete."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def gguf_dir(cache: Path, gguf_file: Path) -> Path:
    """Where ``prepare`` keeps the conversion of ``gguf_file``: ``<cache>/gguf-<key>``, the
    `config.cache_key` of the sha256 of the file's bytes (`config.checkpoint_identity`: not
    its path or mtime) and the dtype it is dequantised to (float32)."""
    return Path(cache) / f"gguf-{cache_key('gguf', 1, gguf=checkpoint_identity(gguf_file), dtype='float32')}"


def derive_base_identity(teacher_dir: Path, kind: str) -> str | list:
    """The teacher's part of a derived student's key: a directory ``prepare`` wrote (``kind``
    ``micro`` or ``gguf``) is named by its content key, so its name; any other directory
    (``hf``) by the sha256 of each of its files (`config.content_identity`: every byte read,
    once per process)."""
    return Path(teacher_dir).name if kind in ("micro", "gguf") else content_identity(teacher_dir, (PREPARED_FILE,))


def derive_dir(cache: Path, base_identity: str | list, keep_layers: Iterable[int]) -> Path:
    """Where ``prepare`` keeps a depth-pruned student: ``<cache>/derive-<key>``, the key
    covering the teacher (`derive_base_identity`) and the kept layers."""
    key = cache_key("derive", 1, teacher=base_identity, keep_layers=list(keep_layers))
    return Path(cache) / f"derive-{key}"


def _plain_config(config: PretrainedConfig) -> PretrainedConfig:
    """A copy of ``config`` without the GGUF loader's ``quantization_config`` (the weights are
    dequantised: the model is a plain float one, which ``save_pretrained`` accepts)."""
    config = copy.deepcopy(config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    return config


def count_params(config: PretrainedConfig) -> int:
    """Parameters of the causal LM of ``config``, tied matrices once (built on the meta
    device: no memory, no weights)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_plain_config(config), trust_remote_code=False)
    return sum(p.numel() for p in model.parameters())


def source_header(gguf_file: Path) -> tuple[PretrainedConfig, PreTrainedTokenizerBase]:
    """The config and tokenizer of a GGUF file, read by transformers' GGUF loader from the
    file's metadata (no tensor is read; the metadata is parsed twice, once for each, which
    takes seconds to tens of seconds for SmolLM2's 49,152-token vocabulary). The tokenizer is
    set up as `load_tokenizer` sets one (left padding)."""
    config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, trust_remote_code=False)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return _plain_config(config), tok


def _check_batch(tok: PreTrainedTokenizerBase) -> torch.Tensor:
    """`CHECK_TEXTS` as a (2, T) int64 batch: the first through the chat template (where the
    tokenizer has one), both cut to the shorter length."""
    first = ([{"role": "user", "content": CHECK_TEXTS[0]}])
    a = (tok.apply_chat_template(first, add_generation_prompt=True, tokenize=True, return_dict=False)
         if tok.chat_template else tok(CHECK_TEXTS[0])["input_ids"])
    b = tok(CHECK_TEXTS[1])["input_ids"]
    n = min(len(a), len(b))
    return torch.tensor([list(a)[:n], list(b)[:n]], dtype=torch.int64)


def _verify_saved(loaded, tok, saved: Path) -> dict:
    """Load ``saved`` back (`load_model`, `load_tokenizer`) and compare with the GGUF load:
    the logits of `_check_batch` bitwise, the vocabulary, special tokens and chat template.

    Raises:
        RuntimeError: anything differs (what, named)."""
    model, tok2 = load_model(saved).eval(), load_tokenizer(saved)
    ids = _check_batch(tok)
    with torch.no_grad():
        want, got = loaded(input_ids=ids).logits, model(input_ids=ids).logits
    diff = (want - got).abs().max().item()
    same_tok = (tok.get_vocab() == tok2.get_vocab() and tok.chat_template == tok2.chat_template
                and tok.all_special_ids == tok2.all_special_ids and torch.equal(_check_batch(tok2), ids))
    if diff != 0 or not torch.equal(want, got) or not same_tok:
        raise RuntimeError(f"{saved}: the saved directory does not reproduce the GGUF load (max |logit difference| "
                           f"{diff:g}, tokenizer {'equal' if same_tok else 'different'})")
    return {"tokens": int(ids.numel()), "max_abs_logit_diff": diff, "tokenizer_equal": True}


def convert_gguf(gguf_file: Path, out_dir: Path) -> dict:
    """Dequantise the GGUF file ``gguf_file`` to float32 and save it as the Hugging Face
    directory ``out_dir`` (module docstring): transformers' GGUF loader builds the model and
    tokenizer (``save_pretrained`` refuses a model loaded from GGUF, so the model is rebuilt
    from its config without the ``quantization_config`` and given the loaded tensors), and the
    saved directory's logits are checked bitwise against the loaded model's (`_verify_saved`).
    A quantised file (SmolLM2-135M-Instruct.Q4_1) gives the dequantised copy of the quantised
    weights, not the original ones. Returns the ``prepare.json`` record.

    Raises:
        RuntimeError: the saved directory does not reproduce the GGUF load."""
    t0 = time.perf_counter()
    where, name = str(gguf_file.parent), gguf_file.name
    tok = AutoTokenizer.from_pretrained(where, gguf_file=name, trust_remote_code=False)
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32,
                                                  trust_remote_code=False).eval()
    model = AutoModelForCausalLM.from_config(_plain_config(loaded.config), trust_remote_code=False)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = copy.deepcopy(loaded.generation_config)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    info = {"source": "gguf", "file": str(gguf_file), "sha256": checkpoint_identity(gguf_file)[1],
            "bytes": gguf_file.stat().st_size, "dtype": "float32", "params": sum(p.numel() for p in model.parameters()),
            "layers": int(model.config.num_hidden_layers), "vocab_size": int(model.config.vocab_size),
            "tied_embeddings": bool(model.config.tie_word_embeddings)}
    info["check"] = _verify_saved(loaded, tok, tmp)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    (tmp / PREPARED_FILE).write_text(json.dumps(info, indent=1))
    publish_dir(tmp, out_dir)
    return info


def check_keep_layers(keep_layers: Iterable[int], layers: int, field: str) -> None:
    """``keep_layers`` of a derived student against its teacher's ``layers``.

    Raises:
        ValueError: an index outside 0..layers-1, a repeat or a decrease (``field`` named,
            with the allowed values)."""
    keep = list(keep_layers)
    bad = [i for i in keep if not 0 <= i < layers]
    if bad:
        raise ValueError(f"{field}.keep_layers: {bad} out of range: the teacher has {layers} layers "
                         f"(allowed: 0..{layers - 1}, strictly increasing)")
    if any(b <= a for a, b in zip(keep, keep[1:])):
        raise ValueError(f"{field}.keep_layers: must be strictly increasing (no repeats), got {keep}")


def pruned_config(config: PretrainedConfig, keep_layers: Iterable[int]) -> PretrainedConfig:
    """The teacher's ``config`` with only ``keep_layers`` (``num_hidden_layers`` and any
    per-layer list such as ``layer_types`` cut to them, in order)."""
    keep, n = list(keep_layers), int(config.num_hidden_layers)
    out = _plain_config(config)
    out.num_hidden_layers = len(keep)
    for name, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == n and name != "architectures":
            setattr(out, name, type(value)(value[i] for i in keep))
    return out


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors weights of ``directory`` (``model.safetensors`` or the
    shards of ``model.safetensors.index.json``), by its stored name.

    Raises:
        FileNotFoundError: no safetensors weights there."""
    index = directory / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists()
             else ["model.safetensors"])
    out = {}
    for f in files:
        if not (directory / f).is_file():
            raise FileNotFoundError(f"{directory}: no safetensors weights ({f} missing)")
        with safe_open(str(directory / f), framework="pt") as s:
            out.update({k: s.get_tensor(k) for k in s.keys()})
    return out


def derive_pruned(teacher_dir: Path, keep_layers: Iterable[int], out_dir: Path, field: str = "models.student.derive"
                  ) -> dict:
    """Write the depth-pruned copy of the teacher in ``teacher_dir`` that keeps ``keep_layers``
    to ``out_dir`` (module docstring): tensor ``model.layers.<keep[j]>.*`` is saved as
    ``model.layers.<j>.*`` (transformers numbers each attention's ``layer_idx``, and so its
    KV-cache slot, from the layer's position when the model is built), every other tensor as
    stored (dtype kept; tied embeddings stay tied), the config pruned (`pruned_config`), the
    tokenizer, chat template and generation config copied. The tensor names are checked
    against the pruned architecture (built on the meta device). Returns the ``prepare.json`` record.

    Raises:
        ValueError: ``keep_layers`` out of range or not increasing (`check_keep_layers`),
            or tensors that do not fit the pruned architecture (named)."""
    t0, keep = time.perf_counter(), list(keep_layers)
    config = AutoConfig.from_pretrained(str(teacher_dir), trust_remote_code=False)
    check_keep_layers(keep, int(config.num_hidden_layers), field)
    new_index = {old: new for new, old in enumerate(keep)}
    tensors = {}
    for name, t in read_safetensors(Path(teacher_dir)).items():
        m = _LAYER.match(name)
        if m is None:
            tensors[name] = t
        elif int(m.group(2)) in new_index:
            tensors[f"{m.group(1)}{new_index[int(m.group(2))]}{m.group(3)}"] = t
    cfg = pruned_config(config, keep)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    expected = set(model.state_dict())
    if cfg.tie_word_embeddings:
        expected -= {n for n, p in model.named_parameters(remove_duplicate=False)
                     if p is model.get_output_embeddings().weight} - set(tensors)
    if set(tensors) != expected:
        raise ValueError(f"{field}: the teacher's tensors do not fit the pruned architecture (layers named "
                         f"model.layers.<i>): missing {sorted(expected - set(tensors))[:4]}, "
                         f"unexpected {sorted(set(tensors) - expected)[:4]}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(tmp)
    for f in Path(teacher_dir).iterdir():
        if f.is_file() and f.name not in ("config.json", PREPARED_FILE) and not _WEIGHTS.fullmatch(f.name):
            shutil.copy2(f, tmp / f.name)
    info = {"source": "derive", "teacher": str(teacher_dir), "keep_layers": keep,
            "teacher_layers": int(config.num_hidden_layers), "params": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.perf_counter() - t0, 1)}
    (tmp / PREPARED_FILE).write_text(json.dumps(info, indent=1))
    publish_dir(tmp, out_dir)
    return info
