#!/usr/bin/env bash
# Install distillab (editable, with the dev extra) into ./.venv on a CPU machine.
# torch is constrained to 2.13.0, the local CPU wheel (constraints/cpu.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints/cpu.txt -e '.[dev]'
echo "installed: $(.venv/bin/python -c 'import torch, ray, transformers; print("torch", torch.__version__, "ray", ray.__version__, "transformers", transformers.__version__)')"
