"""The recipe: the stages of a trial and of preparing its models.

    loss       the loss stage: one forward path, a table of implementations, the oracle
    distill    the trial as a recipe: setup → prompts → rollouts → loss → update → sync → log → finish
    optim      LR schedules, the DeepSpeed engine (precision), one optimizer step, exact resume
    rlvr       GRPO/DAPO after distillation
    teacher    where the teacher scores: in the worker, or a service shared by the sweep
    payload    what a teacher answer costs on the wire (no torch)
    sft        SFT of the micro models; prepare: ``distillab prepare``
    telemetry  metric windows, Ray gauges, where a trial's fixed cost goes
    session    how the recipe talks to its runner (Ray Train, Tune, local)
"""
