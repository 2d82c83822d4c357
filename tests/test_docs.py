"""The docs site (docs/): every config field described, the generated reference pages fresh,
the site built strictly (warnings as errors, nitpicky references, internal links checked), and
every shell block of the hand-written pages marked, parsed and, where marked ``run``, run (the
marker convention is described above `MARKER`).

Regenerate the reference pages with ``python docs/generate.py``; build the site with
``sphinx-build -W --keep-going -n -b html docs docs/_build/html``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("distillab_docs_generate", DOCS / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_config_field_has_a_description():
    missing = _generator().missing_descriptions()
    assert not missing, (
        "config fields without a description (a Field(description=...) or a `#:` comment line directly "
        "above the field in platform/config.py): " + ", ".join(missing))


def test_every_model_reachable_from_the_sweep_is_documented():
    gen = _generator()
    from distillab.config import RLVRConfig, RolloutConfig, SweepConfig

    models = gen.config_models()
    assert {SweepConfig, RolloutConfig, RLVRConfig} <= set(models)
    assert "models.teacher_refine" in models[RLVRConfig] and "trial.rlvr" in models[RLVRConfig]
    page = gen.config_page()
    for m in models:
        for name, f in m.model_fields.items():
            assert f"| `{f.alias or name}` |" in page, (m.__name__, name)


def test_generated_pages_are_fresh():
    stale = _generator().stale()
    assert not stale, f"stale generated docs pages {stale}: run python docs/generate.py and commit them"


def test_reference_pages_cover_the_parser_and_the_registry():
    gen = _generator()
    from distillab.registry import METRICS

    cli, metrics = gen.cli_page(), gen.metrics_page()
    for cmd in ("prepare", "sweep", "report", "findings"):
        assert f"## `distillab {cmd}`" in cli
    for opt in ("--dry-run", "--resume", "--set KEY=VALUE", "--plots DIR", "--by COLUMN"):
        assert f"`{opt}" in cli, opt
    for key in METRICS:
        assert f"| `{key}` |" in metrics, key


def test_readme_is_short_and_runs_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "bash scripts/test.sh" in readme and "bash scripts/micro_study.sh" in readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_site_builds_strictly(tmp_path):
    if any(importlib.util.find_spec(m) is None for m in ("sphinx", "myst_parser", "furo")):
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    build = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
             "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")]
    r = subprocess.run(build, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, f"sphinx-build failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    assert (tmp_path / "html" / "reference" / "config.html").exists()
    shutil.rmtree(tmp_path / "html", ignore_errors=True)


def test_readme_example_is_a_valid_four_trial_sweep(tmp_path):
    from distillab.config import load_sweep

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "extends: search_spaces/micro.yaml" in example
    (tmp_path / "my_study.yaml").write_text(example.replace("search_spaces/micro.yaml",
                                                            str(ROOT / "search_spaces" / "micro.yaml")))
    sweep = load_sweep(tmp_path / "my_study.yaml")
    assert sweep.name == "my_study" and len(sweep.trials) == 4
    assert {t.loss.kind for t in sweep.trials} == {"forward", "jsd"}


# --------------------------------------------------------------------------- the shell blocks of the docs
#
# Every shell block of a hand-written page (a fenced ```bash / sh / shell / console block) carries a
# marker on the line above it, which says how this file checks it:
#
#   <!-- docs-test: run -->      run as written (the slow test below, in a scratch copy of the checkout)
#   <!-- docs-test: long -->     minutes or more (sweeps, studies, benchmarks): parsed, not run
#   <!-- docs-test: gpu -->      needs a CUDA GPU: parsed, not run
#   <!-- docs-test: cluster -->  needs a Ray or Kubernetes cluster: parsed, not run
#
# "Parsed" (the fast test, every block whatever its marker): each `distillab` command goes through the
# CLI's argument parser and, for `sweep`/`prepare` of a file in the repository, through load_sweep with its
# --set overrides; `python -c`/heredoc code compiles; a script it names exists (and takes the --options
# given, for Python scripts); any other program is one of KNOWN_PROGRAMS.

MARKER = re.compile(r"^<!-- docs-test: (run|long|gpu|cluster) -->$")
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
#: hand-written pages whose command blocks are not marked yet: their indented and fenced shell blocks are
#: parsed as if marked `long` (remove a page from here when its blocks carry markers)
UNMARKED_PAGES = ("benchmarks.md", "chaos.md", "layout.md", "real_checkpoints.md")
#: programs a block may call that are not the project's own (checked by nothing here)
KNOWN_PROGRAMS = {"ray", "kubectl", "envsubst", "pip", "jupyter", "kill", "cp", "mkdir", "wandb", "cd", "export",
                  "sphinx-build", "for", "do", "done", "pytest", "true"}
#: the first word of a line that makes an indented block of an unmarked page a shell block
_COMMAND_START = re.compile(r"^(\$ |distillab |python3? |bash |\. |\.venv/|ray |[A-Z_]+=\S* )")


def hand_written_pages() -> list[Path]:
    """README.md and the docs pages written by hand: docs/*.md (the generated findings pages live in
    sub-folders, the reference pages in docs/reference/)."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def shell_blocks(path: Path) -> list[tuple[int, str | None, str]]:
    """``[(line, marker or None, text)]``: the page's fenced shell blocks and, on an `UNMARKED_PAGES`
    page, its indented blocks that start with a command (``line``: 1-based, the block's first line)."""
    lines, blocks, i = path.read_text(encoding="utf-8").splitlines(), [], 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\w*)", lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
            if fence.group(2) in SHELL_LANGUAGES:
                marker = MARKER.match(lines[i - 1]) if i else None
                blocks.append((i + 2, marker.group(1) if marker else None, "\n".join(lines[i + 1:end])))
            i = end + 1
            continue
        if (path.name in UNMARKED_PAGES and lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip())
                and _COMMAND_START.match(lines[i][4:])):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            blocks.append((i + 1, "long", "\n".join(_command_lines([x[4:] for x in lines[i:end]]))))
            i = end
            continue
        i += 1
    return blocks


def _command_lines(lines: list[str]) -> list[str]:
    """The lines of an unmarked indented block that are commands (an output line between them is not):
    those that start like one, and the continuation lines after a trailing backslash."""
    keep, going_on = [], False
    for line in lines:
        if going_on or _COMMAND_START.match(line):
            keep.append(line)
        going_on = (going_on or bool(_COMMAND_START.match(line))) and line.rstrip().endswith("\\")
    return keep


def _expand(line: str, env: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` of the variables a page's blocks set, replaced by their values."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)), line)


def _quotes_closed(line: str) -> bool:
    """Whether the shell would end ``line`` outside a quoted string (else it reads on to the next line)."""
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return False
    return True


def logical_lines(text: str) -> list[tuple[str, str | None]]:
    """``[(command line, heredoc body or None)]``: continuation lines joined, ``$ `` prompts of a console
    block kept (and their output lines dropped), a heredoc's body attached to its command."""
    raw, out, i = text.splitlines(), [], 0
    console = any(x.startswith("$ ") for x in raw)
    while i < len(raw):
        line = raw[i]
        i += 1
        if console and not line.startswith("$ "):
            continue
        line = line[2:] if console else line
        while (line.endswith("\\") or not _quotes_closed(line)) and i < len(raw):
            line = line[:-1] + " " + raw[i].strip() if line.endswith("\\") else line + "\n" + raw[i]
            i += 1
        here = re.search(r"<<-?\s*'?(\w+)'?", line)
        body = None
        if here:
            end = next(j for j in range(i, len(raw)) if raw[j].strip() == here.group(1))
            body, i = "\n".join(raw[i:end]), end + 1
            line = line[:here.start()] + line[here.end():]
        if line.strip():
            out.append((line, body))
    return out


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line: words split as the shell would (quotes, comments), cut at
    ``&&``, ``||``, ``;``, ``|`` and ``&``; redirections and leading ``NAME=value`` words removed."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words, skip = [], [], False
    for word in lexer:
        if skip:
            skip = False
        elif word in ("&&", "||", ";", "|", "&", ";;"):
            commands.append(words)
            words = []
        elif word in ("<", ">", ">>", "2>", "<<"):
            skip = True
        elif not words and re.match(r"^[A-Za-z_]\w*=", word):
            continue
        else:
            words.append(word)
    return [c for c in [*commands, words] if c]


def _python_options(script: Path, args: list[str]) -> list[str]:
    """The ``--options`` of ``args`` that ``script``'s text never names (an argparse script names each)."""
    text = script.read_text(encoding="utf-8")
    return [a.split("=")[0] for a in args if a.startswith("--") and f"\"{a.split('=')[0]}\"" not in text
            and f"'{a.split('=')[0]}'" not in text]


def check_distillab(args: list[str]) -> list[str]:
    """Problems of one `distillab` command: what the CLI's parser rejects, and for `sweep`/`prepare` of
    a file in the repository, what load_sweep says about the file with its ``--set`` overrides."""
    from distillab.config import load_sweep
    from distillab.driver.cli import _parser, parse_overrides

    try:
        ns = _parser().parse_args(args)
    except SystemExit:
        return [f"distillab {' '.join(args)}: the CLI's parser rejects it"]
    config = getattr(ns, "config", None)
    if ns.cmd in ("sweep", "prepare") and config and (ROOT / config).is_file():
        try:
            load_sweep(ROOT / config, parse_overrides(getattr(ns, "set", None) or []))
        except Exception as e:  # noqa: BLE001 - a config error of any kind is the finding
            return [f"distillab {' '.join(args)}: {type(e).__name__}: {e}"]
    return []


def check_command(words: list[str], body: str | None) -> list[str]:
    """Problems of one simple command of a docs block (module comment above: what "parsed" means)."""
    prog, args = words[0], words[1:]
    if prog == "distillab":
        return check_distillab(args)
    if prog in ("python", "python3") or prog.endswith("/bin/python"):
        if args[:1] == ["-c"]:
            code, where = args[1], "python -c"
        elif args[:1] == ["-"]:
            code, where = body or "", "python - (heredoc)"
        elif args[:1] == ["-m"]:
            return [] if importlib.util.find_spec(args[1]) else [f"python -m {args[1]}: no such module"]
        else:
            script = ROOT / args[0]
            if not script.is_file():
                return [f"python {args[0]}: no such file"]
            bad = _python_options(script, args[1:])
            return [f"python {args[0]}: options {bad} are not in the script"] if bad else []
        try:
            compile(code, where, "exec")
        except SyntaxError as e:
            return [f"{where}: {type(e).__name__}: {e}"]
        return []
    if prog in ("bash", ".", "source"):
        target = args[0]
        return [] if target.startswith(".venv/") or (ROOT / target).is_file() else [f"{prog} {target}: no such file"]
    if prog.startswith(".venv/bin/"):
        return [] if prog.rsplit("/", 1)[1] in KNOWN_PROGRAMS | {"distillab"} else [f"{prog}: not a known program"]
    return [] if prog in KNOWN_PROGRAMS else [f"{prog}: not a known program (KNOWN_PROGRAMS in tests/test_docs.py)"]


def _assignment(line: str) -> tuple[str, str] | None:
    """``(name, value)`` when the line only sets a shell variable (``NAME=value``, ``export NAME=value``)."""
    words = shlex.split(line, comments=True)
    words = words[1:] if words[:1] == ["export"] else words
    if len(words) == 1 and re.match(r"^[A-Za-z_]\w*=", words[0]):
        name, value = words[0].split("=", 1)
        return name, value
    return None


def check_block(text: str, env: dict[str, str]) -> list[str]:
    """Problems of one shell block; ``env`` collects the variables the page's blocks set, in order."""
    problems = []
    for line, body in logical_lines(text):
        line = _expand(line, env)
        if assignment := _assignment(line):
            env.update([assignment])
            continue
        for words in simple_commands(line):
            problems += check_command(words, body)
    return problems


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: p.name)
def test_shell_blocks_are_marked_and_parse(page: Path) -> None:
    """Every shell block of the page carries a docs-test marker (UNMARKED_PAGES aside), and every command
    in it parses: the CLI's parser and load_sweep for `distillab`, compile() for Python code, scripts
    that exist and take the options given."""
    env: dict[str, str] = {}
    problems = []
    for line, marker, text in shell_blocks(page):
        if marker is None:
            problems.append(f"{page.name}:{line}: a shell block without <!-- docs-test: run|long|gpu|cluster -->")
        problems += [f"{page.name}:{line}: {p}" for p in check_block(text, env)]
    assert not problems, "\n".join(problems)


def test_the_block_checks_find_what_they_should() -> None:
    """The checks above on blocks with known faults: the IndentationError of an indented `python -c`, an
    option a script does not take, a sweep key that does not exist, a program nobody knows."""
    indented = 'python -c "from pathlib import Path\n  print(Path)"'
    assert any("IndentationError" in p for p in check_block(indented, {}))
    assert check_block("python -c 'print(1)'", {}) == []
    assert any("--no-such-option" in p for p in check_block("python benchmarks/rollout.py --no-such-option", {}))
    assert any("no_such_key" in p for p in check_block(
        "distillab sweep search_spaces/smoke.yaml --set trial.no_such_key=1", {}))
    env: dict[str, str] = {}
    assert check_block('S="--set name=x"\ndistillab sweep search_spaces/smoke.yaml $S --dry-run', env) == []
    assert env == {"S": "--set name=x"}
    assert any("frobnicate" in p for p in check_block("frobnicate --all", {}))
    assert check_block("python - <<'EOF'\nimport json\nprint(json.dumps(1))\nEOF", {}) == []
    assert any("SyntaxError" in p for p in check_block("python - <<'EOF'\nprint(\nEOF", {}))


#: what a `run` block must print, where its page shows the output in prose (page → lines of stdout)
RUN_OUTPUT = {
    "running.md": ["payload bytes per token: logits (in-worker) 216, hidden 256, topk 2 20, topk 8 68"],
    "rlvr.md": ["[14819, 14783]"],
    "python_api.md": ["4 trials planned", "66 trials in docs/data/micro_findings", "the rule holds"],
}


def _sandbox(tmp_path: Path) -> Path:
    """A scratch checkout: every top-level entry of the repository linked in, except what a run writes
    (``.cache``, ``runs``) and ``.git``, so that relative paths in the docs resolve and nothing the
    blocks write lands in the repository."""
    box = tmp_path / "checkout"
    box.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".cache", "runs", ".git"):
            (box / entry.name).symlink_to(entry)
    return box


def _python_here(args: list[str], body: str | None, monkeypatch) -> None:
    """``python ARGS`` in this interpreter: ``-c CODE``, ``-`` (the heredoc's body) or a script with its
    arguments as ``sys.argv``, each as ``__main__``; a `SystemExit` other than 0 fails."""
    import runpy

    try:
        if args[0] in ("-c", "-"):
            code = args[1] if args[0] == "-c" else body or ""
            exec(compile(code, f"<python {args[0]}>", "exec"), {"__name__": "__main__"})  # noqa: S102 - docs code
        else:
            monkeypatch.setattr(sys, "argv", list(args))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), f"python {shlex.join(args)}: exit {e.code}"


def run_line(words: list[str], body: str | None, box: Path, env: dict[str, str], capsys, monkeypatch) -> str:
    """Run one simple command of a ``run`` block in the scratch checkout ``box`` (the current directory)
    and return its stdout. `distillab` and ``python`` commands run in this interpreter (the console
    script's `distillab.driver.cli.main` with the same argv; the code or script as ``__main__``), which
    spares each a fresh interpreter's imports; anything else runs through bash, a heredoc's body on its
    stdin."""
    capsys.readouterr()
    if words[0] == "distillab":
        from distillab.driver.cli import main

        rc = main(words[1:])
        out = capsys.readouterr()
        assert rc == 0, f"{shlex.join(words)}: exit {rc}\n{out.out[-2000:]}\n{out.err[-2000:]}"
        return out.out
    if words[0] in ("python", "python3") or words[0].endswith("/bin/python"):
        _python_here(words[1:], body, monkeypatch)
        return capsys.readouterr().out
    r = subprocess.run(["bash", "-c", shlex.join(words)], check=False, cwd=box, env={**os.environ, **env}, input=body,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{shlex.join(words)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.slow
def test_run_blocks_run_as_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """Every block marked ``run`` runs as written, line by line in a scratch checkout (`_sandbox`) with
    the page's variables set as its blocks set them and the repository's virtualenv first on PATH;
    where the page quotes a block's output (`RUN_OUTPUT`), the block prints it."""
    box = _sandbox(tmp_path)
    monkeypatch.chdir(box)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    ran = []
    for page in hand_written_pages():
        env: dict[str, str] = {}
        out = []
        for _, marker, text in shell_blocks(page):
            for line, body in logical_lines(text):
                line = _expand(line, env)
                if assignment := _assignment(line):  # a variable another block sets is set here too
                    env.update([assignment])
                    continue
                if marker != "run":
                    continue
                for command in simple_commands(line):
                    if command[:1] != ["."]:  # sourcing sets this shell's variables: nothing to run alone
                        out.append(run_line(command, body, box, env, capsys, monkeypatch))
        if out:
            ran.append(page.name)
        for expected in RUN_OUTPUT.get(page.name, []):
            assert expected in "".join(out), (page.name, expected)
    assert {"getting_started.md", "paper_sweeps.md", "running.md", "results.md"} <= set(ran), ran


def test_kuberay_manifest_fills_with_envsubst() -> None:
    """deploy/kuberay-rayjob.yaml names one variable, ``${IMAGE}``, which docs/cluster.md fills with
    ``envsubst '${IMAGE}'`` before ``kubectl apply`` (which fills nothing); filled, it is a RayJob whose
    pods run that image with the hub reachable for the paper files' lm-eval suite."""
    import yaml

    text = (ROOT / "deploy" / "kuberay-rayjob.yaml").read_text(encoding="utf-8")
    assert set(re.findall(r"\$\{?(\w+)", text)) == {"IMAGE"}
    assert "envsubst '${IMAGE}' < deploy/kuberay-rayjob.yaml | kubectl apply -f -" in (DOCS / "cluster.md").read_text()
    job = yaml.safe_load(text.replace("${IMAGE}", "registry.example.com/distillab:0.1"))
    assert job["kind"] == "RayJob" and job["spec"]["entrypoint"].startswith("distillab sweep ")
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert container["image"] == "registry.example.com/distillab:0.1"
        assert env["HF_HUB_OFFLINE"] == "0" and env["HF_HOME"].startswith("/shared/")


def test_the_rules_page_renders_the_strings_findings_prints(monkeypatch):
    """reference/rules.md is rendered from `distillab.analysis.rules`, the strings `distillab findings`
    prints: each finding's claim and every clause of its rule; a rule changed there changes the page."""
    from distillab.analysis import rules

    gen = _generator()
    page = gen.rules_page()
    for f, r in rules.RULES.items():
        assert f"## {f}\n\n{r.claim}\n" in page
        assert all(f"- {k + ' ' if k else ''}{v}\n" in page for k, v in r.clauses.items()), f
    assert rules.confidence_note() in page and "How §9 is read" in page
    monkeypatch.setitem(rules.RULES, "F4", rules.Rule("A CLAIM", {"": "A RULE"}))
    assert "## F4\n\nA CLAIM\n\n- A RULE\n" in gen.rules_page()


def test_the_config_reference_lists_the_study_axes_and_the_cross_field_rules():
    from distillab.config.rules import RULES
    from distillab.registry import AXES

    page = _generator().config_page()
    assert all(f"| `{key}` | " in page for key in AXES)
    assert "| `rollout.max_staleness` | staleness | yes | when not the default |" in page
    assert "| `seed` | seed | no (averaged over) | always |" in page
    assert all(r.doc.replace("|", "\\|") in page for r in RULES)
    assert "`rollout.max_staleness` > 0 needs `optimizer.zero_stage` 0, 1 or 2" in page
