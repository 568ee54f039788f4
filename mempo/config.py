"""The run configuration schema: one dataclass per config group of ``experiments/configs``.

Hydra composes the YAML tree; ``validate_config`` merges it into this schema, so a key that does not exist is an
error naming the full key, and a value of the wrong type is an error naming key and value, both before any model
loads. Value ranges are checked by ``check_values``. Keys repeat the keyword names of the functions they feed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.data.synthetic import SPLITS
from mempo.losses import ADVANTAGE_ESTIMATORS, AGG_MODES, KL_KINDS, MEMORY_BASELINES, MEMORY_NORMALIZE

CONTEXT_MODES = ("memory", "full_history")
REWARD_KINDS = ("all_em", "mean_em", "mean_f1")
SAMPLER_BACKENDS = ("vllm", "hf")
RETRIEVERS = ("bm25", "http")
DATA_SOURCES = ("synthetic", "qa_files")
LOGGERS = ("csv", "wandb")


@dataclass
class ModelSchema:
    name_or_path: str = "smollm2-135m-instruct"  # a local HF folder, "smollm2-135m-instruct", "tiny", or a hub id
    dtype: str = "float32"
    trust_remote_code: bool = False
    cache_dir: str | None = None  # default: $MEMPO_CACHE or ~/.cache/mempo
    gradient_checkpointing: bool = False
    train_top_layers: int | None = None  # RL trains only the last k decoder layers (+ final norm); null = all


@dataclass
class SamplerSchema:
    backend: str = "vllm"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 160
    dtype: str = "float32"
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    max_model_len: int = 4096
    enable_sleep_mode: bool = False
    kv_cache_space_gb: int | None = 2
    sync_every: int = 1  # push weights into the engine every k optimizer steps
    canary_every: int = 1  # compare engine and trainer log-probs of a probe after every k-th push; 0 = off
    canary_tol: float = 1e-3  # mean absolute log-prob difference (nats per token) that stops the run
    canary_tokens: int = 8  # greedy tokens of the probe the engine generates and the trainer scores


@dataclass
class EnvSchema:
    retriever: str = "bm25"
    corpus: str | None = None  # JSONL {"id","contents"}; null = the synthetic world's corpus
    url: str | None = None  # http retriever endpoint, e.g. http://127.0.0.1:8000/retrieve
    topk: int = 2
    max_passage_tokens: int = 64
    timeout_s: float = 10.0
    max_retries: int = 3
    backoff_s: float = 0.5


@dataclass
class TagsSchema:
    mem: str = "mem"
    think: str = "think"
    search: str = "search"
    answer: str = "answer"
    information: str = "information"


@dataclass
class AgentSchema:
    context: str = "memory"  # memory (MemPO) | full_history (ReAct baseline)
    max_turns: int = 16
    keep_previous_turn: bool = False  # also keep the previous turn's <think>/<search> text in a memory prompt
    max_context_tokens: int = 3072  # a prompt longer than this ends the rollout (format failure: runaway context)


@dataclass
class DataSchema:
    source: str = "synthetic"
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    objectives: int = 2
    batch_size: int = 4  # tasks per RL step
    group_size: int = 4  # G rollouts per task
    world_seed: int = 0
    num_val_tasks: int = 16
    num_workers: int = 0


@dataclass
class RewardSchema:
    kind: str = "all_em"


@dataclass
class MemorySchema:
    alpha: float = 1.0
    baseline: str = "previous_memory"
    normalize: str = "pooled"
    include_tags: bool = True
    log_p_ans: bool = False  # score memories even with the memory advantage off (memory/p_ans_mean of ablations)


@dataclass
class AdvantageSchema:
    estimator: str = "mempo"
    scale: bool = True


@dataclass
class LossSchema:
    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 1e-3
    kl_kind: str = "k3"
    agg: str = "traj_mean_token_mean"
    tis_cap: float | None = None


@dataclass
class OptimSchema:
    lr: float = 1e-6
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    micro_batch_size: int = 8
    old_logp: str = "auto"  # auto | sampler | recompute
    max_nonfinite: int = 3  # non-finite gradients in a row before the run stops
    skip_no_signal: bool = True  # no AdamW update on a step whose advantages are all 0 and kl_coef = 0


@dataclass
class TrainerSchema:
    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_steps: int = 3
    log_every_n_steps: int = 1


@dataclass
class LoggerSchema:
    kind: str = "csv"
    project: str = "mempo"
    entity: str | None = None
    mode: str | None = None  # wandb mode; null = online when an API key is configured, else offline
    tags: list[str] = field(default_factory=list)


@dataclass
class SFTSchema:
    trajectories: str | None = None  # JSONL of teacher trajectories; null = the synthetic oracle's
    num_tasks: int = 256  # teacher tasks per entry of sft.objectives
    objectives: list[int] | None = None  # questions per task, one task set each; null = [data.objectives]
    batch_size: int = 8
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 4
    lr_schedule: str = "cosine"  # constant | cosine (to min_lr_ratio * lr at the last step)
    min_lr_ratio: float = 0.1
    epochs: int = 1
    max_steps: int = -1


@dataclass
class EvalSchema:
    num_tasks: int = 16
    objectives: list[int] = field(default_factory=lambda: [1, 2, 4, 6, 8, 10])
    agents: list[str] = field(default_factory=lambda: ["memory", "full_history"])
    greedy: bool = True
    checkpoints: dict[str, str] | None = None  # label -> HF folder; null = model.name_or_path
    every_n_steps: int = 0  # in-training validation on data.num_val_tasks val tasks every k RL steps; 0 = off
    turn_slack: int | None = 1  # tasks of N objectives get 2N + 1 + turn_slack turns; null = agent.max_turns
    score_memories: bool = True  # P(ans | q, m) of every memory of the evaluation (a forward per memory)
    max_trajectories: int = 8  # sample trajectories per checkpoint x agent x N in the W&B table
    split: str = "val"  # val (held-out world) | train (the training world: RL's task distribution) | test


@dataclass
class HeadlineSchema:
    """The ``headline`` stage (MemPO vs GRPO vs ReAct as N grows): warm starts to reuse instead of training them."""

    warm_start: str | None = None  # HF folder of the memory-context warm start; null = <run_dir>/warm_start/hf
    react_warm_start: str | None = None  # the full-history (ReAct) one; null = <run_dir>/react_warm_start/hf


@dataclass
class CkptSchema:
    every_n_steps: int = 2


@dataclass
class RootSchema:
    name: str = "demo"
    stage: str = "demo"
    seed: int = 0
    run_dir: str = "runs/default"
    resume: bool = False
    verbose: bool = False  # third-party logs on the console too (they always go to <run_dir>/run.log)
    model: ModelSchema = field(default_factory=ModelSchema)
    sampler: SamplerSchema = field(default_factory=SamplerSchema)
    env: EnvSchema = field(default_factory=EnvSchema)
    tags: TagsSchema = field(default_factory=TagsSchema)
    agent: AgentSchema = field(default_factory=AgentSchema)
    data: DataSchema = field(default_factory=DataSchema)
    reward: RewardSchema = field(default_factory=RewardSchema)
    memory: MemorySchema = field(default_factory=MemorySchema)
    advantage: AdvantageSchema = field(default_factory=AdvantageSchema)
    loss: LossSchema = field(default_factory=LossSchema)
    optim: OptimSchema = field(default_factory=OptimSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    ckpt: CkptSchema = field(default_factory=CkptSchema)
    sft: SFTSchema = field(default_factory=SFTSchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    headline: HeadlineSchema = field(default_factory=HeadlineSchema)


STAGES = ("rl", "sft", "demo", "headline")


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"config key {key}={value!r} is not one of {list(allowed)}")


def check_values(cfg: DictConfig) -> None:
    """Range and choice checks, each naming the key (called before any model loads)."""
    _choice("stage", cfg.stage, STAGES)
    _choice("agent.context", cfg.agent.context, CONTEXT_MODES)
    _choice("reward.kind", cfg.reward.kind, REWARD_KINDS)
    _choice("sampler.backend", cfg.sampler.backend, SAMPLER_BACKENDS)
    _choice("env.retriever", cfg.env.retriever, RETRIEVERS)
    _choice("data.source", cfg.data.source, DATA_SOURCES)
    _choice("logger.kind", cfg.logger.kind, LOGGERS)
    _choice("memory.baseline", cfg.memory.baseline, MEMORY_BASELINES)
    _choice("memory.normalize", cfg.memory.normalize, MEMORY_NORMALIZE)
    _choice("loss.kl_kind", cfg.loss.kl_kind, KL_KINDS)
    _choice("loss.agg", cfg.loss.agg, AGG_MODES)
    _choice("advantage.estimator", cfg.advantage.estimator, tuple(sorted(ADVANTAGE_ESTIMATORS)))
    _choice("optim.old_logp", cfg.optim.old_logp, ("auto", "sampler", "recompute"))
    _choice("sft.lr_schedule", cfg.sft.lr_schedule, ("constant", "cosine"))
    checks = [
        ("data.group_size", cfg.data.group_size >= 2, "must be >= 2 (GRPO needs a group)"),
        ("data.batch_size", cfg.data.batch_size >= 1, "must be >= 1"),
        ("data.objectives", cfg.data.objectives >= 1, "must be >= 1"),
        ("loss.eps_low", 0.0 < cfg.loss.eps_low < 1.0, "must be in (0, 1)"),
        ("loss.eps_high", cfg.loss.eps_high > 0.0, "must be > 0"),
        ("loss.kl_coef", cfg.loss.kl_coef >= 0.0, "must be >= 0"),
        ("agent.max_turns", cfg.agent.max_turns >= 1, "must be >= 1"),
        ("sampler.temperature", cfg.sampler.temperature >= 0.0, "must be >= 0"),
        ("sampler.top_p", 0.0 < cfg.sampler.top_p <= 1.0, "must be in (0, 1]"),
        ("sampler.max_new_tokens", cfg.sampler.max_new_tokens >= 1, "must be >= 1"),
        ("sampler.canary_every", cfg.sampler.canary_every >= 0, "must be >= 0 (0 = off)"),
        ("sampler.canary_tol", cfg.sampler.canary_tol > 0.0, "must be > 0"),
        ("sampler.canary_tokens", cfg.sampler.canary_tokens >= 1, "must be >= 1"),
        ("optim.lr", cfg.optim.lr > 0.0, "must be > 0"),
        ("optim.ppo_epochs", cfg.optim.ppo_epochs >= 1, "must be >= 1"),
        ("optim.micro_batch_size", cfg.optim.micro_batch_size >= 1, "must be >= 1"),
        ("env.topk", cfg.env.topk >= 1, "must be >= 1"),
        ("ckpt.every_n_steps", cfg.ckpt.every_n_steps >= 1, "must be >= 1"),
        ("sft.batch_size", cfg.sft.batch_size >= 1, "must be >= 1"),
        ("sft.lr", cfg.sft.lr > 0.0, "must be > 0"),
        ("sft.num_tasks", cfg.sft.num_tasks >= 1, "must be >= 1"),
        (
            "sft.objectives",
            cfg.sft.objectives is None or (len(cfg.sft.objectives) > 0 and min(cfg.sft.objectives) >= 1),
            "must be null or a non-empty list of numbers >= 1",
        ),
        ("sft.min_lr_ratio", 0.0 <= cfg.sft.min_lr_ratio <= 1.0, "must be in [0, 1]"),
        ("eval.num_tasks", cfg.eval.num_tasks >= 1, "must be >= 1"),
        ("eval.objectives", len(cfg.eval.objectives) > 0 and min(cfg.eval.objectives) >= 1, "must be >= 1 each"),
        (
            "eval.agents",
            len(cfg.eval.agents) > 0 and set(cfg.eval.agents) <= set(CONTEXT_MODES),
            f"must be a non-empty subset of {list(CONTEXT_MODES)}",
        ),
        ("eval.every_n_steps", cfg.eval.every_n_steps >= 0, "must be >= 0"),
        ("eval.turn_slack", cfg.eval.turn_slack is None or cfg.eval.turn_slack >= 0, "must be null or >= 0"),
        ("eval.split", cfg.eval.split in SPLITS, f"must be one of {list(SPLITS)}"),
        ("data.num_val_tasks", cfg.data.num_val_tasks >= 1, "must be >= 1"),
    ]
    for key, ok, why in checks:
        if not ok:
            raise ValueError(f"config key {key}={OmegaConf.select(cfg, key)!r} {why}")
    if cfg.env.retriever == "http" and not cfg.env.url:
        raise ValueError("config key env.url is required when env.retriever=http")
    if cfg.data.source == "qa_files" and not cfg.data.train_files:
        raise ValueError("config key data.train_files is required when data.source=qa_files")


def check_paths(cfg: DictConfig) -> None:
    """Inputs that must exist, each error naming the key (called by ``run_stage`` and ``fit_rl`` before any model
    loads; not by ``validate_config``, so configs for another machine still compose here):
    model.name_or_path (an embedded name, a model folder, or an owner/name hub id), env.corpus, the data files
    of data.source=qa_files, sft.trajectories, and the headline's warm-start folders when set."""
    from mempo.models.loading import check_model_path

    try:
        check_model_path(cfg.model.name_or_path)
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(f"config key model.name_or_path={cfg.model.name_or_path!r}: {e}") from e
    files = [("env.corpus", cfg.env.corpus), ("sft.trajectories", cfg.sft.trajectories)]
    if cfg.data.source == "qa_files":
        files += [(f"data.{k}[{i}]", f) for k in ("train_files", "val_files") for i, f in enumerate(cfg.data[k])]
    for key, f in files:
        if f is not None and not Path(f).is_file():
            raise FileNotFoundError(f"config key {key}={f!r}: no such file")
    for key in ("headline.warm_start", "headline.react_warm_start"):
        folder = OmegaConf.select(cfg, key)
        if folder is not None and not (Path(folder) / "config.json").is_file():
            raise FileNotFoundError(f"config key {key}={folder!r}: not a model folder (no config.json in it)")


def validate_config(cfg: DictConfig) -> DictConfig:
    """Merge a composed config into the schema (unknown keys and wrong types raise, naming the key), then check
    value ranges. Returns the typed, read-only config."""
    schema = OmegaConf.structured(RootSchema)
    cfg = OmegaConf.merge(schema, cfg)  # raises ConfigKeyError / ValidationError naming the full key
    check_values(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16). Without them torch's bf16
    matmuls fall back to a scalar kernel that runs several times slower than float32 (measured: a warm-start step
    on an AVX2-only CPU took minutes under bf16 autocast)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, accelerator: str) -> str:
    """``trainer.precision=auto``: bf16-mixed on GPUs and on CPUs with native bf16 (``cpu_has_bf16``), else
    32-true. Any other value is returned as given."""
    if precision != "auto":
        return precision
    if accelerator in ("gpu", "cuda", "auto"):
        import torch

        if torch.cuda.is_available():
            return "bf16-mixed"
    return "bf16-mixed" if cpu_has_bf16() else "32-true"


CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"


def compose_config(*overrides: str, config_dir: str | Path = CONFIG_DIR) -> DictConfig:
    """The experiment config tree composed with Hydra and validated, as ``experiments/run.py`` does, from Python
    (benchmarks, tests, notebooks): ``compose_config("+exp=ablation_nomem", "trainer.max_steps=2")``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return validate_config(compose(config_name="config", overrides=list(overrides)))
