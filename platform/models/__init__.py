"""Models and tokenizers: the micro models (`micro`), how a trial computes in bf16 on this
machine (`precision`), loading any causal LM directory through ``from_pretrained`` (`load`),
and the real-checkpoint sources resolved into such directories (`sources`: a GGUF file
dequantised, a depth-pruned student; imported as ``distillab.models.sources``).

`trust_remote_code` is always off; weights are saved as safetensors.
"""

from distillab.models.load import (
    check_lm_heads,
    check_same_vocab,
    configure_passes,
    load_model,
    load_tokenizer,
    neutral_generation_config,
)
from distillab.models.micro import CHAT_TEMPLATE, SPECIAL_TOKENS, TAG_TOKENS, build_char_tokenizer, micro_llama_config
from distillab.models.precision import (
    BF16_MATMULS,
    BF16_MATMULS_CHOICES,
    BF16_MATMULS_ENV,
    DTYPES,
    Bf16MatmulsInFloat32,
    arithmetic,
    bf16_in_float32,
    bf16_matmuls,
    bf16_matmuls_choice,
    cpu_has_native_bf16,
    cpu_model,
)

__all__ = [
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "CHAT_TEMPLATE",
    "build_char_tokenizer",
    "micro_llama_config",
    "DTYPES",
    "cpu_has_native_bf16",
    "BF16_MATMULS",
    "Bf16MatmulsInFloat32",
    "BF16_MATMULS_ENV",
    "BF16_MATMULS_CHOICES",
    "bf16_matmuls_choice",
    "bf16_in_float32",
    "cpu_model",
    "arithmetic",
    "bf16_matmuls",
    "load_tokenizer",
    "load_model",
    "configure_passes",
    "neutral_generation_config",
    "check_lm_heads",
    "check_same_vocab",
]
