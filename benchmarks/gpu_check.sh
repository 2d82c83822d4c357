#!/usr/bin/env bash
# The first check to run on a GPU machine: is the GPU path of distillab working?
#
#   bash benchmarks/gpu_check.sh                          # all rows this machine can run (<= 8 min on one GPU)
#   bash benchmarks/gpu_check.sh --json out.json --only ops-torch,trial-tiny-bpe
#
# Prints one line per row as it finishes, then a table (row, pass / fail / skip, seconds, reason);
# every row's output goes to $OUT/gpu_check.log when OUT names a folder for results, else .cache/gpu_check.log. Rows and what they check:
# benchmarks/gpu_check.py's docstring and docs/cluster.md ("The GPU check"). Without CUDA the GPU rows are
# skipped and the CPU rows run (CI runs it that way: tests/test_gpu_check.py). Exit 1 if a row failed.
#
# distillab is installed (no dependencies, nothing downloaded) only where it is not importable yet,
# e.g. on a bare GPU machine that has torch, triton and transformers; PYTHON picks the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import distillab.ops" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -2
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_check.py "$@"
