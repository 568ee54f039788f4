"""The run configuration: one frozen dataclass per config group of ``experiments/configs``.

Each group's dataclass is the code's own parameter object, defined beside the code that takes it (``loss`` ->
``mempo.losses.LossConfig``, ``sampler`` -> ``mempo.rollout.sampler.SamplerConfig``, ...), and is at once the
structured schema Hydra's composed YAML is merged into: a key that does not exist is an error naming the full key,
a value of the wrong type is an error naming key and value, and every range and choice check runs in the group's
own ``__post_init__`` -- all before any model loads. The groups defined here are the orchestration's own (trainer,
logger, ckpt, headline, demo, study). Field defaults are the defaults; YAML group options state only their deltas
from them (tests/stages/test_config_contract.py holds both to that). Keys repeat the keyword names of the functions
they feed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.capacity.gpu_memory import PlanConfig
from mempo.core.base import one_of, require
from mempo.core.format import Tags
from mempo.core.hardware import cpu_has_bf16, cpu_precision
from mempo.data.datamodule import DataConfig
from mempo.eval.compare import EvalConfig
from mempo.lm.loading import ModelConfig, check_model_path
from mempo.losses import AdvantageConfig, LossConfig, MemoryConfig
from mempo.models.module import OptimConfig
from mempo.models.sft import SFTConfig
from mempo.rollout.agent import AgentConfig
from mempo.rollout.env import EnvConfig
from mempo.rollout.rewards import RewardConfig
from mempo.rollout.sampler import SamplerConfig
from mempo.stages.plugins import register_plugins
from mempo.stages.rundir import register_resolver

LOGGERS = ("csv", "wandb")
STAGES = ("rl", "sft", "eval", "demo", "headline", "study")  # mempo.stages


@dataclass(frozen=True)
class TrainerConfig:
    """Config group ``trainer``: keyword arguments of ``lightning.Trainer`` (``mempo.stages.train.make_trainer``).

    precision: a Lightning precision, or auto: bf16-mixed on GPUs and on CPUs with AMX, else 32-true
    (``resolve_precision``).
    strategy: a Lightning strategy name (auto, ddp, ...) or fsdp2 (``mempo.models.parallel.FSDP2Strategy``: FSDP2
    data-parallel sharding through ``ModelParallelStrategy``). Lightning's fsdp (FSDP1) and deepspeed strategies are
    refused: both run ``training_step`` inside the wrapped model's forward, where MemPO's manual optimization (its
    backward inside the step) is not supported.
    """

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "auto"
    max_steps: int = 3
    log_every_n_steps: int = 1

    def __post_init__(self) -> None:
        require(
            "trainer",
            self,
            [
                ("num_nodes", self.num_nodes >= 1, "must be >= 1"),
                ("max_steps", self.max_steps >= 1, "must be >= 1"),
                ("log_every_n_steps", self.log_every_n_steps >= 1, "must be >= 1"),
                (
                    "strategy",
                    not str(self.strategy).startswith(("fsdp", "deepspeed")) or self.strategy == "fsdp2",
                    "fsdp and deepspeed are not supported (manual optimization inside the wrapped forward); use "
                    "fsdp2 (trainer=fsdp) or ddp",
                ),
            ],
        )


@dataclass(frozen=True)
class LoggerConfig:
    """Config group ``logger``: csv | wandb; mode: the W&B mode, null = online with an API key, else offline."""

    kind: str = "csv"
    project: str = "mempo"
    entity: str | None = None
    mode: str | None = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        require("logger", self, [("kind", self.kind in LOGGERS, one_of(LOGGERS))])


@dataclass(frozen=True)
class CkptConfig:
    """Config group ``ckpt``: a Lightning checkpoint (``last.ckpt``) every k RL steps; with ``hf_every_n_steps`` > 0
    also the policy as a Hugging Face folder ``hf_steps/step-<k>`` every that many steps, kept (a learning curve's
    checkpoints for ``experiments/eval.py``'s ``eval.checkpoints``)."""

    every_n_steps: int = 2
    hf_every_n_steps: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("every_n_steps", self.every_n_steps >= 1, "must be >= 1"),
            ("hf_every_n_steps", self.hf_every_n_steps >= 0, "must be >= 0 (0 = off)"),
        ]
        require("ckpt", self, checks)


@dataclass(frozen=True)
class HeadlineConfig:
    """The ``headline`` stage (MemPO vs GRPO vs ReAct as N grows): warm starts to reuse instead of training them.

    warm_start: HF folder of the memory-context warm start; null = <run_dir>/warm_start/hf.
    react_warm_start: the full-history (ReAct) one; null = <run_dir>/react_warm_start/hf.
    """

    warm_start: str | None = None
    react_warm_start: str | None = None


# Keys the demo keeps from the run's config whatever its RL recipe sets: the budget (steps and tasks per step: the
# main job's 25 minutes hold 2 steps of 2 tasks x the recipe's G), the learning rate at that budget (config.yaml's
# 1e-5, not grpo_cpu's 3e-5: from a float32-trained warm start, as an AVX2 machine trains it, 3e-5 lost 0.070, 0.047
# and 0.008 EM at RL seeds 0-2 and 1e-5 lost 0.016 and 0.023, within noise; docs/results.md), and memory.log_p_ans
# (scoring every memory for P(ans | mem) when alpha = 0, a diagnostic for comparing arms: ~25 s of a ~3 min step).
DEMO_OWN_KEYS = (
    "trainer.max_steps",
    "data.batch_size",
    "ckpt.every_n_steps",
    "eval.every_n_steps",
    "optim.lr",
    "memory.log_p_ans",
)


@dataclass(frozen=True)
class DemoConfig:
    """The ``demo`` stage's RL phase (``mempo.stages.demo``).

    rl_exp: the experiment (``experiments/configs/exp/<rl_exp>.yaml``) whose recipe the RL phase applies on top of
      the run's config, like the headline's arms: its keys but the demo's own (``DEMO_OWN_KEYS``: the run's
      trainer.max_steps, data.batch_size, ckpt.every_n_steps, optim.lr and memory.log_p_ans, and ``val_every``),
      and but any key set on the command line (which wins). null = the run's config as is (config.yaml's MemPO
      defaults).
    val_every: in-training validation every k RL steps on data.num_val_tasks held-out tasks (0 = off).
    """

    rl_exp: str | None = "grpo_cpu"
    val_every: int = 2

    def __post_init__(self) -> None:
        exists = self.rl_exp is None or (CONFIG_DIR / "exp" / f"{self.rl_exp}.yaml").is_file()
        require(
            "demo",
            self,
            [
                ("rl_exp", exists, f"must be null or the name of a file in {CONFIG_DIR / 'exp'}"),
                ("val_every", self.val_every >= 0, "must be >= 0"),
            ],
        )


# host.mmap_threshold_mb=auto fixes glibc's mmap threshold for RL runs of at least this many steps (docs/performance.md,
# "Long runs": it costs about a fifth of a step; with the oneDNN caches capped the RSS stays flat without it).
LONG_RUN_STEPS = 40


@dataclass(frozen=True)
class HostConfig:
    """Config group ``host``: the training process's host memory over a long run (``mempo.models.callbacks.HostMemory``;
    docs/performance.md, "Long runs").

    release_every: after every k-th RL step, a garbage collection and glibc's ``malloc_trim(0)`` hand the pages its
      malloc arenas hold free back to the kernel (0 = never). A run's RSS grew 0.2-0.35 GB a step on vLLM-CPU, nearly
      all of it freed tensors of each step's new shapes held by fragmented arenas; the release alone holds what the
      process keeps between steps to the pace of its live bytes, the threshold below stops the fragmenting.
    rss_warn_growth: one console warning when the RSS has grown by more than this share since the process's second
      RL step (0 = off).
    mmap_threshold_mb: from the RL stage's start, glibc serves every allocation of this many MiB or more by its own
      mmap, returned to the kernel when freed, so the heap arenas hold no large blocks to fragment (null = glibc's
      own threshold, which rises to 32 MiB as blocks are freed). It costs about a fifth of a step (each large tensor's
      pages are faulted in fresh); auto: 1 MiB for RL runs of at least ``LONG_RUN_STEPS`` steps, else null. Off by
      default: with ``onednn_cache_capacity`` set, a 40-step soak held a flat RSS without it.
    onednn_cache_capacity: entries kept by oneDNN's primitive cache and by ideep's computation cache, one per matmul
      shape (``mempo.core.hardware.bound_onednn_caches``, set at the run's start; null = the libraries' 1,024 each,
      which fill with every new sequence length for hundreds of steps).
    profile_update_steps: RL steps (from 1) whose old log-probs and update run under ``torch.profiler``, summed by
      phase and operator family into <run_dir>/profile/update_step<k>.json (``mempo.models.profiling``; [] = none).
    """

    release_every: int = 1
    rss_warn_growth: float = 0.5
    mmap_threshold_mb: Any = None
    onednn_cache_capacity: int | None = 8
    profile_update_steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        require(
            "host",
            self,
            [
                ("release_every", self.release_every >= 0, "must be >= 0 (0 = never)"),
                ("rss_warn_growth", self.rss_warn_growth >= 0, "must be >= 0 (0 = off)"),
                (
                    "mmap_threshold_mb",
                    self.mmap_threshold_mb in (None, "auto")
                    or (isinstance(self.mmap_threshold_mb, (int, float)) and 0 < self.mmap_threshold_mb <= 32),
                    "must be null, auto or in (0, 32] MiB",
                ),
                (
                    "onednn_cache_capacity",
                    self.onednn_cache_capacity is None
                    or (isinstance(self.onednn_cache_capacity, int) and self.onednn_cache_capacity >= 1),
                    "must be null or an integer >= 1",
                ),
                (
                    "profile_update_steps",
                    all(isinstance(k, int) and k >= 1 for k in self.profile_update_steps),
                    "must be a list of RL steps, each an integer >= 1",
                ),
            ],
        )

    def threshold_mb(self, rl_steps: int) -> float | None:
        """``mmap_threshold_mb`` with auto resolved by the RL run's length (``LONG_RUN_STEPS``)."""
        if self.mmap_threshold_mb == "auto":
            return 1.0 if rl_steps >= LONG_RUN_STEPS else None
        return None if self.mmap_threshold_mb is None else float(self.mmap_threshold_mb)


def default_study_arms() -> dict[str, Any]:
    """The study's arms: the ablation (GRPO with the memory format) and MemPO, on the same recipe."""
    return {"ablation": {"memory": {"alpha": 0.0}}, "mempo": {"memory": {"alpha": 1.0}}}


@dataclass(frozen=True)
class StudyConfig:
    """The ``study`` stage (``+exp=study``, ``mempo.stages.study``): arms x seeds of RL from one warm start, one
    evaluation of every final checkpoint and the warm start, and the seed-level report.

    warm_start: HF folder of the warm start every memory-agent arm starts from; null = <run_dir>/warm_start/hf,
      trained when missing (the demo's warm start).
    react_warm_start: the same for the arms whose delta sets agent.context=full_history (a ReAct agent): a warm start
      on the same teacher trajectories rendered with the full-history prompts; null = <run_dir>/react_warm_start/hf,
      trained when such an arm runs. Those arms are evaluated as full-history agents and compared with it.
    recipe: the experiment (``experiments/configs/exp/<recipe>.yaml``) whose keys every arm applies on top of the
      run's config, but trainer.max_steps (the study's budget) and eval.every_n_steps (no in-training validation);
      null = the run's config as is.
    arms: arm -> its config delta on top of the recipe (nested keys, e.g. {memory: {alpha: 1.0}}; {} = the recipe);
      null drops an arm (Hydra merges mappings, so ``study.arms.mempo=null +study.arms.lora.model.lora.rank=16``
      replaces one; exp/study_lora.yaml does so in a file).
    reference: the arm every other arm is compared with.
    also_reference: further arms every other arm is also compared with, the same way (e.g. [react]: MemPO and GRPO
      against a ReAct arm as well as against the ablation).
    seeds: the RL seeds of every arm (K = their number), fixed before the study runs; arms pair by seed.
    memory_scores: score every evaluated memory by P(gold | question, memory) under the warm start, one fixed scorer
      for all arms (``mempo.eval.memory_scores``: memory_scores.csv/.md/.png and study.json's "memory_scores").
    ledger: a folder that keeps each checkpoint's evaluation and each run's small outputs beyond the run folders
      (``mempo.stages.ledger``): each arm-seed is evaluated as soon as it has trained, and a study run again with the
      same ledger (on another machine, or after its run folders were lost) trains and evaluates only what it lacks;
      null = none (one evaluation after every run, as before).
    """

    warm_start: str | None = None
    react_warm_start: str | None = None
    recipe: str | None = "grpo_cpu"
    arms: dict[str, Any] = field(default_factory=default_study_arms)
    reference: str = "ablation"
    also_reference: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    memory_scores: bool = True
    ledger: str | None = None

    @property
    def run_arms(self) -> list[str]:
        """The arms that run, in config order: those not set to null."""
        return [arm for arm, delta in dict(self.arms).items() if delta is not None]

    def __post_init__(self) -> None:
        exists = self.recipe is None or (CONFIG_DIR / "exp" / f"{self.recipe}.yaml").is_file()
        arms = dict(self.arms)
        require(
            "study",
            self,
            [
                ("recipe", exists, f"must be null or the name of a file in {CONFIG_DIR / 'exp'}"),
                ("arms", any(v is not None for v in arms.values()), "must name at least one arm (not null)"),
                (
                    "arms",
                    all(re.fullmatch(r"[A-Za-z0-9_-]+", str(a)) and a != "warm_start" for a in arms),
                    "arm names are folder names: letters, digits, _ and - (and not warm_start)",
                ),
                ("arms", all(v is None or hasattr(v, "items") for v in arms.values()), "each arm must be a mapping"),
                ("reference", self.reference in self.run_arms, f"must be one of the arms {self.run_arms}"),
                (
                    "also_reference",
                    all(a in self.run_arms and a != self.reference for a in self.also_reference),
                    f"must name arms among {self.run_arms} other than study.reference",
                ),
                ("seeds", len(self.seeds) >= 1, "must hold at least one seed"),
                ("seeds", len(set(self.seeds)) == len(self.seeds), "must not repeat a seed"),
            ],
        )


def exp_delta(name: str | None, *, _chain: tuple[str, ...] = ()) -> dict[str, Any]:
    """The dotted keys ``experiments/configs/exp/<name>.yaml`` sets, less ``name`` and ``stage`` ({} for None). A
    defaults list may name other exp files (``- grpo_cpu``): their keys come first, in the list's order, then the
    file's own (or at ``_self_``), as Hydra composes them. An entry that swaps a config group (``override /model:
    ...``) is not a key delta: a ValueError naming the file and the entry."""
    if name is None:
        return {}
    if name in _chain:
        raise ValueError(f"exp/{name}.yaml: its defaults list includes itself ({' -> '.join((*_chain, name))})")
    path = CONFIG_DIR / "exp" / f"{name}.yaml"
    if not path.is_file():
        where = f" (in the defaults list of exp/{_chain[-1]}.yaml)" if _chain else ""
        raise ValueError(f"exp/{name}.yaml: no such file in {CONFIG_DIR / 'exp'}{where}")
    raw = OmegaConf.to_container(OmegaConf.load(path))
    defaults = raw.pop("defaults", None) or []
    own: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                own[prefix + k] = v

    walk(raw, "")
    own = {k: v for k, v in own.items() if k not in ("name", "stage")}
    flat: dict[str, Any] = {}
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    for entry in defaults:
        if entry == "_self_":
            flat.update(own)
        elif isinstance(entry, str) and re.fullmatch(r"[A-Za-z0-9_-]+", entry):
            flat.update(exp_delta(entry, _chain=(*_chain, name)))
        else:
            raise ValueError(
                f"exp/{name}.yaml: defaults entry {entry!r} swaps a config group; only other exp files (plain names) "
                "and _self_ can be applied as a key delta to a phase"
            )
    return flat


@dataclass(frozen=True)
class SweepConfig:
    """Where this run sits in a sweep: set by ``experiments/run.py`` from Hydra and the environment
    (``mempo.stages.rundir.hydra_job``), not by hand, and recorded in every stage's summary.json.

    kind: null (a single run) | hydra (a job of a Hydra multirun, ``-m``) | wandb (a run a W&B sweep agent started).
    dir: the sweep's folder (hydra.sweep.dir, by default run_dir; for W&B <run_dir>/sweep-<sweep id>).
    job: the job's number in the multirun, or its W&B run id; its folder is <dir>/<job> (Hydra's default subdir).
    overrides: the job's command-line overrides (Hydra's hydra.overrides.task), also for a single run.
    """

    kind: str | None = None
    dir: str | None = None
    job: str | None = None
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        require("sweep", self, [("kind", self.kind in (None, "hydra", "wandb"), "must be null, hydra or wandb")])


@dataclass(frozen=True)
class RootConfig:
    """The run: its stage, seed and folder, and one field per config group.

    run_dir: every output of the run goes here; in a sweep, each job's own folder (``mempo.stages.rundir``).
    resume: continue the RL run in run_dir from its last checkpoint (same step, optimizer state, RNG, data order).
    overwrite: a training stage (rl, sft) deletes an earlier run's checkpoint, metrics, policy and summary in run_dir
      and trains anew; without it (or resume) it refuses such a folder, naming it. A composed stage (demo,
      headline) trains every phase again instead of reusing the ones it finished. Excludes resume.
    accept_changes: dotted keys (or groups) whose change a reuse or resume accepts: a finished phase, a study's
      arm-seed or a killed RL run is otherwise refused when its saved config or the weights it started from
      (``provenance.model``) differ from this run's (``mempo.stages.reuse``).
    verbose: third-party logs (vLLM, Lightning, warnings) on the console too; they always go to <run_dir>/run.log.
    sweep: set by experiments/run.py (``SweepConfig``).
    """

    name: str = "demo"
    stage: str = "demo"
    seed: int = 0
    run_dir: str = "runs/default"
    resume: bool = False
    overwrite: bool = False
    accept_changes: list[str] = field(default_factory=list)
    verbose: bool = False
    sweep: SweepConfig = field(default_factory=SweepConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    tags: Tags = field(default_factory=Tags)
    agent: AgentConfig = field(default_factory=AgentConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    headline: HeadlineConfig = field(default_factory=HeadlineConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    host: HostConfig = field(default_factory=HostConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)  # experiments/plan.py

    def __post_init__(self) -> None:
        require(
            "",
            self,
            [
                ("stage", self.stage in STAGES, one_of(STAGES)),
                ("overwrite", not (self.overwrite and self.resume), "and resume=true exclude each other"),
            ],
        )


def schema() -> DictConfig:
    """``RootConfig`` as an OmegaConf structured config that composed YAML can be merged into (OmegaConf marks
    the nodes of frozen dataclasses read-only; the validated config is made read-only again as a whole)."""
    node = OmegaConf.structured(RootConfig)

    def writable(n: DictConfig) -> None:
        OmegaConf.set_readonly(n, None)
        for key in n:
            child = n._get_node(key)
            if isinstance(child, DictConfig):
                writable(child)

    writable(node)
    return node


def trains_warm_start(cfg: DictConfig) -> bool:
    """Whether ``cfg.stage`` trains a warm start: sft, demo and headline do; the study does without study.warm_start."""
    return cfg.stage in ("sft", "demo", "headline") or (cfg.stage == "study" and cfg.study.warm_start is None)


def require_teacher(cfg: DictConfig) -> None:
    """A warm start on real data needs the user's teacher trajectories: without ``sft.trajectories`` it would train on
    the synthetic oracle and replay its fictional queries against the real retriever."""
    if not cfg.sft.trajectories and cfg.data.source != "synthetic":
        raise ValueError(
            f"config key sft.trajectories=null with data.source={cfg.data.source}: the warm start would train on the "
            "synthetic oracle's trajectories and replay its fictional queries against your retriever. mempo has no "
            "teacher for real data: give sft.trajectories=TEACHER.jsonl, one task a line, "
            '{"task_id", "objectives": [{"question", "answers", "qid"}], "turns": ["<mem>...</mem><think>...</think>'
            '<search>...</search>", ..., "...<answer>a1; a2</answer>"]} (mempo.data.oracle), e.g. distilled from a '
            "larger model as MEM1 does; or start RL from a checkpoint of your own (stage=rl model.name_or_path=...)"
        )


def check_paths(cfg: DictConfig) -> None:
    """Inputs that must exist, each error naming the key (called by ``run_stage`` and ``fit_rl`` before any model
    loads; not by ``validate_config``, so configs for another machine still compose here):
    model.name_or_path (an embedded name, a model folder, or an owner/name hub id), env.corpus, the data files
    of data.source=qa_files, sft.trajectories, and the headline's and the study's warm-start folders when set.
    Real data searched in the synthetic world's corpus (data.source=qa_files, env=bm25, env.corpus=null) is refused
    too: every reward would be about 0 and nothing would say why."""
    if cfg.data.source != "synthetic" and cfg.env.retriever == "bm25" and not cfg.env.corpus:
        raise ValueError(
            f"config keys data.source={cfg.data.source} with env.retriever=bm25 and env.corpus=null: the questions "
            "would be searched in the synthetic world's corpus. Use env=http env.url=... (a Search-R1 retrieval "
            "server, docs/guide/real-data.md) or env.corpus=CORPUS.jsonl (a BM25 corpus of your own)"
        )
    try:
        check_model_path(cfg.model.name_or_path)
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(f"config key model.name_or_path={cfg.model.name_or_path!r}: {e}") from e
    files = [("env.corpus", cfg.env.corpus), ("sft.trajectories", cfg.sft.trajectories)]
    if cfg.data.source == "qa_files":
        files += [
            (f"data.{k}[{i}]", f) for k in ("train_files", "val_files", "test_files") for i, f in enumerate(cfg.data[k])
        ]
    for key, f in files:
        if f is not None and not Path(f).is_file():
            raise FileNotFoundError(f"config key {key}={f!r}: no such file")
    for key in ("headline.warm_start", "headline.react_warm_start", "study.warm_start"):
        folder = OmegaConf.select(cfg, key)
        if folder is not None and not (Path(folder) / "config.json").is_file():
            raise FileNotFoundError(f"config key {key}={folder!r}: not a model folder (no config.json in it)")


SCHEMA_NAME = "mempo_schema"


def register_schema() -> None:
    """Store ``RootConfig`` in Hydra's ConfigStore as ``mempo_schema``, the first entry of config.yaml's defaults
    list: the YAML groups compose on top of the dataclasses, so an override of a key no YAML file states
    (``sampler.top_p=0.9``) works, and Hydra itself rejects unknown keys and wrong types. Runs when this module is
    imported (every composition imports it to validate); idempotent."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema())


def validate_config(cfg: DictConfig) -> DictConfig:
    """Merge a composed config into ``RootConfig`` (unknown keys and wrong types raise, naming the key), then build
    every group's dataclass once, which runs its range and choice checks, and check and register the code that
    reward.kind, env.retriever or advantage.estimator name by import path (``mempo.stages.plugins``). Returns the
    typed, read-only config."""
    # As plain containers: a config Hydra composed onto mempo_schema is typed already, and OmegaConf cannot merge a
    # typed dict into a null Optional[Dict] node (eval.checkpoints={...} from the command line).
    plain = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else cfg
    cfg = OmegaConf.merge(schema(), plain)  # raises ConfigKeyError / ValidationError naming the full key
    OmegaConf.to_object(cfg)  # each group's __post_init__: ValueError naming "config key group.key=value"
    register_plugins(cfg)  # a user's reward, retriever, estimator by import path: checked, then registered
    OmegaConf.set_readonly(cfg, True)
    return cfg


def require_eval_task_count(cfg: DictConfig, stage: str) -> int:
    """``eval.num_tasks`` for a stage that compares checkpoints on a fixed number of held-out tasks (demo, headline):
    null (each question of the split once) is for ``stage=eval``, an error here naming the key."""
    if cfg.eval.num_tasks is None:
        raise ValueError(
            f"eval.num_tasks=null (each question of the split once) is for stage=eval; stage={stage} needs a number "
            "of held-out tasks per N (e.g. eval.num_tasks=64)"
        )
    return int(cfg.eval.num_tasks)


def on_gpu(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` puts the run on a GPU here (gpu, cuda, or auto with CUDA present)."""
    if accelerator not in ("gpu", "cuda", "auto"):
        return False
    import torch

    return torch.cuda.is_available()


def resolve_precision(precision: str, accelerator: str) -> str:
    """``trainer.precision=auto``: bf16-mixed on GPUs and on CPUs with native bf16 (``cpu_precision``: AVX512-BF16 or
    AMX), else 32-true (AVX2). Any other value is returned as given."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if on_gpu(accelerator) else cpu_precision()


def native_bf16(accelerator: str) -> bool:
    """Whether this machine has native bf16 kernels: a GPU (``on_gpu``) or a CPU with AVX512-BF16 or AMX
    (``cpu_has_bf16``). What ``sampler.dtype=auto`` and ``eval.engine_dtype=auto`` follow, whatever the trainer's
    precision: decoding is bound by reading the weights, and a bf16 engine generated 1.53x the float32 engine's tokens
    a second on a 2-core AVX512-BF16 EPYC without AMX (docs/performance.md, "RL rollouts per hour")."""
    return on_gpu(accelerator) or cpu_has_bf16()


CONFIG_DIR = Path(__file__).resolve().parents[2] / "experiments" / "configs"


def compose_config(*overrides: str, config_dir: str | Path = CONFIG_DIR) -> DictConfig:
    """The experiment config tree composed with Hydra and validated, as ``experiments/run.py`` does, from Python
    (benchmarks, tests, notebooks): ``compose_config("+exp=ablation_nomem", "trainer.max_steps=2")``. The overrides
    are recorded in ``sweep.overrides``, as run.py records the command line's."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    recorded = {"sweep": {"overrides": [o for o in overrides if not o.startswith("sweep.")]}}
    return validate_config(OmegaConf.merge(OmegaConf.to_container(cfg), recorded))


register_schema()
register_resolver()  # config.yaml's hydra.run.dir uses it
