# Sourced by scripts/*: keep caches and temp files inside the project (.cache/).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DISTILLAB_CACHE="$here/.cache"
mkdir -p "$here/.cache/tmp" "$here/.cache/torch_extensions" "$here/.cache/vllm" "$here/.cache/inductor"
export TMPDIR="$here/.cache/tmp"
export TORCH_EXTENSIONS_DIR="$here/.cache/torch_extensions"
export VLLM_CACHE_ROOT="$here/.cache/vllm"
export TORCHINDUCTOR_CACHE_DIR="$here/.cache/inductor"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}   # offline by default; HF_HUB_OFFLINE=0 for lm-eval's hub datasets
export HF_HOME="$here/.cache/huggingface"   # datasets/hub caches stay in the project too
export TOKENIZERS_PARALLELISM=false
export RAY_TRAIN_V2_ENABLED=1
