"""Config: a sweep YAML validated into frozen pydantic models before any compute.

Every number of PROTOCOL.md that the platform uses is a field here, with the
paper's value as its default where one makes sense; the micro study overrides
some in ``search_spaces/micro.yaml`` and says why there. Unknown keys and
out-of-range values are errors that name the field.

The package, by concern (each module imports only those above it):

    base        the strict pydantic bases, dotted-key helpers
    rules       every rule that relates two or more fields, in one place (the validators call it)
    tasks       the task registry's config half (`TaskEntry`) and the tasks' settings (`TasksConfig`)
    training    rollout policy, divergence and estimator, teacher, optimizer, RLVR
    models      teacher and student sources, the micro models' architecture and SFT
    evaluation  what every stage reports (the evaluation suite, lm-eval, style)
    seeds       every random stream of a trial
    trial       one trial, its cross-field rules, its id
    search      grids, unions of grids, Optuna domains, early stopping
    identity    cache keys and checkpoint identity
    errors      one line per bad field
    grid        the trial at a search point
    sweep       the sweep, its grid expansion, resources, trackers, runtime context and launch record
    load        reading a sweep YAML (``extends:``, ``--set``)
    checks      what needs neither Ray nor torch, checked before Ray starts

    >>> cfg = load_sweep("search_spaces/micro.yaml")
    >>> [t.trial_id for t in expand_trials(cfg)][:1]
"""

from distillab.config.base import flatten, set_dotted
from distillab.config.errors import ConfigError
from distillab.config.evaluation import (
    CODE_EXECUTING_TASKS,
    PAPER_OOD_SUITE,
    EvaluationConfig,
    LMEvalConfig,
    LMEvalTask,
    ProseConfig,
    StyleConfig,
)
from distillab.config.grid import apply_point, point_of
from distillab.config.identity import cache_key, checkpoint_identity, config_hash, content_identity, file_sha256
from distillab.config.load import UniqueKeyLoader, load_sweep, load_yaml, with_overrides, yaml_error_line
from distillab.config.models import (
    SOURCE_KINDS,
    SOURCE_SPELLINGS,
    DeriveSpec,
    GGUFPackageFile,
    MicroModelConfig,
    ModelsConfig,
    ModelSource,
)
from distillab.config.search import SEARCHABLE, Domain, GridConfig, SchedulerConfig, SearchConfig
from distillab.config.seeds import SeedsConfig
from distillab.config.sweep import (
    SWEEP_FILE,
    FaultToleranceConfig,
    MLflowTracking,
    ResourcesConfig,
    RuntimeContext,
    SweepConfig,
    TrackingConfig,
    TrialLaunch,
    WandbTracking,
    expand_trials,
)
from distillab.config.tasks import (
    MCQ_INSTRUCTION,
    PAPER_POOL,
    SMALL_POOL,
    CountdownTaskConfig,
    MathTaskConfig,
    MCQTaskConfig,
    TaskEntry,
    TasksConfig,
    TaskSettings,
)
from distillab.config.training import LoRAConfig, LossConfig, OptimizerConfig, RLVRConfig, RolloutConfig, TeacherConfig
from distillab.config.trial import TrialConfig

__all__ = [
    "flatten",
    "set_dotted",
    "PAPER_POOL",
    "SMALL_POOL",
    "MCQ_INSTRUCTION",
    "CountdownTaskConfig",
    "MCQTaskConfig",
    "MathTaskConfig",
    "TasksConfig",
    "TaskSettings",
    "TaskEntry",
    "RolloutConfig",
    "LossConfig",
    "TeacherConfig",
    "OptimizerConfig",
    "LoRAConfig",
    "RLVRConfig",
    "MicroModelConfig",
    "ModelsConfig",
    "ModelSource",
    "GGUFPackageFile",
    "DeriveSpec",
    "SOURCE_SPELLINGS",
    "SOURCE_KINDS",
    "LMEvalTask",
    "PAPER_OOD_SUITE",
    "CODE_EXECUTING_TASKS",
    "LMEvalConfig",
    "ProseConfig",
    "StyleConfig",
    "EvaluationConfig",
    "SeedsConfig",
    "TrialConfig",
    "SEARCHABLE",
    "Domain",
    "SchedulerConfig",
    "GridConfig",
    "SearchConfig",
    "config_hash",
    "cache_key",
    "checkpoint_identity",
    "content_identity",
    "file_sha256",
    "ConfigError",
    "expand_trials",
    "apply_point",
    "point_of",
    "ResourcesConfig",
    "FaultToleranceConfig",
    "WandbTracking",
    "MLflowTracking",
    "TrackingConfig",
    "SWEEP_FILE",
    "SweepConfig",
    "RuntimeContext",
    "TrialLaunch",
    "UniqueKeyLoader",
    "load_yaml",
    "yaml_error_line",
    "load_sweep",
    "with_overrides",
]
