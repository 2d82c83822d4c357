"""Rollouts: every way a trial samples completions (DESIGN.md "Rollout engines").

- `distillab.rollout.types`: `SamplingParams`, `Rollouts`, the `RolloutEngine` interface and
  the batch packing shared by training and evaluation (`pack_rollouts`, `position_ids`,
  `engine_logprobs`);
- `distillab.rollout.decode`: the static-KV-cache sampler of Llama/Qwen2 models;
- `distillab.rollout.engine`: `TransformersEngine`, in-process sampling;
- `distillab.rollout.actor`: `VLLMEngine`, the Ray actor that holds an engine beside the
  trainer (`RolloutActor`) and its client (`ActorSampler`, weight sync);
- `distillab.rollout.spectrum`: the λ-spectrum sampler between student and teacher
  (PROTOCOL.md §3);
- `distillab.rollout.source`: where a trial's worker takes each step's rollouts from
  (`RolloutSource`: OffPD sets, engine actors, in-process sampling).

Rollouts never carry gradients: the trainer re-scores them with its own forward pass.
Import the submodules directly; this package's ``__init__`` imports nothing.
"""
