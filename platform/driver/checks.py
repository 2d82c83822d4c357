"""The checks that need neither Ray nor torch, run before Ray starts (`cli.main`; DESIGN.md,
"Fail before compute"): each returns why an input is bad, in one line that names its field
or flag, or None. The standard library and the registry only, so that they cost nothing at start-up.

- `storage_error`: a results directory (``storage_path``, ``models.cache_dir``, ``--resume``,
  ``report --plots``) is a writable directory or can be created (the nearest existing
  folder above it is a writable directory);
- `checkpoint_files_error`: a ``models.*_path`` is a checkpoint folder with a config, a
  tokenizer and (for a run) weights, naming the missing file; given ``config.json``
  itself, it says to give the folder;
- `env_errors`: the environment switches distillab reads (`ENV_SWITCHES`);
- `number_errors`: the CLI's numeric flags against their ranges (`NUMBER_FLAGS`).

What needs the cluster (placeability) is `plan.unplaceable`, asked right after Ray connects.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from distillab.registry import ENV_SWITCHES

#: Files of a checkpoint folder (``from_pretrained``'s): the config, and either of each group
CONFIG_FILE = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")

#: The CLI's numeric flags: (argparse destination, lowest allowed, whether the lowest is allowed)
NUMBER_FLAGS = {"--nodes": ("nodes", 1, True), "--node-cpus": ("node_cpus", 0, False),
                "--node-gpus": ("node_gpus", 0, True), "--throughput": ("throughput", 0, False),
                "--threads": ("threads", 1, True)}


def storage_error(raw: str | Path, what: str) -> str | None:
    """Why the directory ``raw`` cannot hold results (``what`` names the field or flag in
    the message), or None: it is a writable directory, or the nearest existing folder above
    it is one (where it will be created). Writability is tried (`_unwritable`): a file
    created and removed at once; nothing else is created."""
    path = Path(raw).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            return f"{what}: {raw} is a file, not a directory"
        why = _unwritable(path)
        return f"{what}: {raw} is not writable ({why})" if why else None
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{what}: {raw} cannot be created: {above} is a file, not a directory"
    why = _unwritable(above)
    return f"{what}: {raw} cannot be created in {above} ({why})" if why else None


def _unwritable(directory: Path) -> str | None:
    """Why no file can be created in ``directory`` (the OS's reason), or None. Tried, not
    read from the permission bits: root passes ``os.access`` where a read-only mount or a
    virtual file system (/proc, /sys) still refuses."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".distillab-probe-", dir=directory)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def checkpoint_files_error(raw: str | Path, field: str, weights: bool = True) -> str | None:
    """Why ``raw`` (the value of ``field``, e.g. ``models.teacher_path``) is not a checkpoint
    folder, or None: it exists, is a folder, holds `CONFIG_FILE`, one of `TOKENIZER_FILES`
    and, with ``weights``, one of `WEIGHT_FILES` (or a sharded ``*.safetensors``)."""
    path = Path(raw).expanduser()
    if not path.exists():
        return f"{field}: {path} does not exist (give a checkpoint directory: --set {field}=DIR)"
    if not path.is_dir():
        hint = f"; give its folder: --set {field}={path.parent}" if path.name == CONFIG_FILE else ""
        return f"{field}: {path} is a file, not a checkpoint directory{hint}"
    names = {p.name for p in path.iterdir()}
    if CONFIG_FILE not in names:
        return f"{field}: {path} is not a checkpoint directory (no {CONFIG_FILE} in it)"
    if not names & set(TOKENIZER_FILES):
        return (f"{field}: {path} has no tokenizer files: none of {', '.join(TOKENIZER_FILES)} "
                f"(save the tokenizer beside the model: tokenizer.save_pretrained(DIR))")
    if "vocab.json" in names and "tokenizer.json" not in names and "merges.txt" not in names:
        return f"{field}: {path} has vocab.json but no merges.txt (the BPE tokenizer's merges)"
    if weights and not (names & set(WEIGHT_FILES) or any(n.endswith(".safetensors") for n in names)):
        return f"{field}: {path} has no weights: none of {', '.join(WEIGHT_FILES)}"
    return None


def env_errors() -> list[str]:
    """The environment switches (`ENV_SWITCHES`) set to a value they do not allow, each named
    with its allowed values."""
    out = []
    for name, allowed in ENV_SWITCHES.items():
        value = os.environ.get(name)
        if value is not None and value not in allowed:
            out.append(f"{name}={value!r}; allowed values: {', '.join(allowed)}")
    return out


def number_errors(args: object) -> list[str]:
    """The numeric flags of ``args`` (argparse's namespace; `NUMBER_FLAGS`) out of their range."""
    out = []
    for flag, (dest, low, inclusive) in NUMBER_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if math.isnan(value) or value < low or (value == low and not inclusive):
            out.append(f"{flag} {value:g}: must be {'>=' if inclusive else '>'} {low:g}")
    return out
