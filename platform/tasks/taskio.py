"""Task input and output shared by every task: the renderer (a task's `base.Prompt`, system
prompt and user text, into token ids, the one place that knows the tokenizer's chat template
or the micro tokenizer's plain format), and a local task file read as one ``datasets`` split
(the multiple-choice and math files). Nothing in a file is executed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["render", "render_prompt", "read_local_split", "launch_path", "LAUNCH_DIR_ENV"]

#: The environment variable that holds the directory a sweep was started in (set by
#: `driver.raystart` for every Ray worker, whose own working directory is Ray's): relative task
#: file paths are read from there (`launch_path`)
LAUNCH_DIR_ENV = "DISTILLAB_LAUNCH_DIR"


def render(tokenizer, prompt) -> list[int]:
    """Prompt token ids of a task's `base.Prompt` (``prompt.system``, ``prompt.user``): `render_prompt`."""
    return render_prompt(tokenizer, prompt.system, prompt.user)


def render_prompt(tokenizer, system: str, user: str) -> list[int]:
    """Prompt token ids: the chat template when the tokenizer has one (a system turn, the user
    turn, the generation prompt), else ``system\\n\\nuser\\n``.

    ``system`` is the whole system prompt; ``""`` means none. With ``""`` no system turn is given,
    unless the template then writes one of its own (SmolLM2's and Qwen2.5's put in a default system
    prompt, "You are a helpful AI assistant named SmolLM, ..."): then an empty system turn is given,
    so the model sees no system text it was not configured with (`_fills_in_system`).
    The text is tokenized without added special tokens (the template holds them)."""
    if getattr(tokenizer, "chat_template", None):
        turns = [{"role": "user", "content": user}]
        if system or _fills_in_system(tokenizer):
            turns.insert(0, {"role": "system", "content": system})
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    else:
        text = (system + "\n\n" if system else "") + user + "\n"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


#: `_fills_in_system`'s answers, by chat template text
_FILLS_IN: dict[str, bool] = {}
#: A system prompt no template writes by itself (`_fills_in_system`'s probe)
_PROBE = "\x00distillab system probe\x00"


def _fills_in_system(tokenizer) -> bool:
    """Whether ``tokenizer``'s chat template writes a system turn of its own when the messages
    have none: the text before a probe system prompt (the system turn's opening, e.g.
    ``<|im_start|>system\\n``) appears in the rendering of a user turn alone. Once per template."""
    template = tokenizer.chat_template
    if template not in _FILLS_IN:
        def chat(turns):
            return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

        user = [{"role": "user", "content": "x"}]
        try:
            opening = chat([{"role": "system", "content": _PROBE}, *user]).split(_PROBE)[0]
        except Exception:  # noqa: BLE001  (a template that refuses system turns, e.g. Gemma's: it writes none)
            opening = ""
        _FILLS_IN[template] = bool(opening) and opening in chat(user)
    return _FILLS_IN[template]


def launch_path(path) -> Path:
    """``path`` as given when absolute; a relative one joined to the directory the sweep was started
    in (`LAUNCH_DIR_ENV`, which a sweep's Ray workers get; unset: this process's working directory),
    so a task file given as ``my_data/test.jsonl`` is the same file in ``prepare`` and in every trial."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else Path(os.environ.get(LAUNCH_DIR_ENV) or os.getcwd()) / path


def read_local_split(path, split: str, what: str):
    """A local ``.jsonl``/``.json``/``.parquet`` file as one ``datasets`` split
    (``datasets.load_dataset`` with ``data_files``), or a ``datasets`` directory (written by
    ``Dataset.save_to_disk``: that dataset; by ``DatasetDict.save_to_disk``: its split ``split``),
    nothing downloaded, nothing executed. ``what`` names the file's role in messages
    ("multiple-choice file"). A relative ``path`` is read from the directory the sweep was
    started in (`launch_path`).

    Returns:
        The ``datasets.Dataset`` (at least one row).

    Raises:
        FileNotFoundError: no such file or directory.
        ValueError: unsupported extension (names the allowed ones); a directory that is no saved
            dataset, or a saved DatasetDict without split ``split`` (names its splits); no rows.
    """
    from datasets import DatasetDict, load_dataset, load_from_disk  # a second of imports, for file tasks only

    given, path = path, launch_path(path)
    if path.is_dir():
        try:
            ds = load_from_disk(str(path))
        except FileNotFoundError:
            raise ValueError(f"{what} {path}: a directory, but no dataset saved with save_to_disk") from None
        if isinstance(ds, DatasetDict):
            if split not in ds:
                raise ValueError(f"{what} {path}: no split {split!r}; it has {sorted(ds)}")
            ds = ds[split]
    elif not path.is_file():
        where = "" if Path(given).expanduser().is_absolute() else f" (a relative path is read from {path.parent})"
        raise FileNotFoundError(f"{what} {given} does not exist{where}")
    else:
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix.lower())
        if kind is None:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r} (allowed: .jsonl, .json, .parquet, or a "
                             "datasets directory)")
        try:
            ds = load_dataset(kind, data_files={split: str(path)}, split=split)
        except StopIteration:  # datasets' JSON reader on a file without rows
            ds = []
    if len(ds) == 0:
        raise ValueError(f"{path}: split {split!r} is empty")
    return ds
