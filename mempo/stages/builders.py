"""Build the run's objects from a validated config (the only place that reads config groups).

A config group's node is its own dataclass (``mempo.stages.config``): ``group(cfg, "loss")`` is the frozen
``LossConfig`` the code takes, so the algorithm never sees a config object and no group's fields are copied by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.core.base import temp_sibling
from mempo.core.console import say
from mempo.core.format import Tags
from mempo.core.hardware import rate_kind
from mempo.core.tasks import Question, Task
from mempo.data.compose import compose_tasks, source_counts, subset_by_source, task_capacity
from mempo.data.qa_files import id_prefixes, load_qa_items
from mempo.data.synthetic import SPLITS, SyntheticQuestion, SyntheticWorld, split_questions
from mempo.lm.loading import ModelConfig, cache_root, load_policy, resolve_model_path, train_top_layers
from mempo.lm.lora import apply_lora, base_fingerprint
from mempo.models.module import MemPOModule, OptimConfig
from mempo.rollout.env import EnvConfig, SearchEnv
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import make_retriever
from mempo.rollout.rewards import normalize_answer
from mempo.rollout.sampler import Sampler, SamplerConfig
from mempo.stages.config import native_bf16, resolve_precision


def run_path(cfg: DictConfig, *parts: str) -> Path:
    """A path inside ``run_dir`` (every output of a run stays there)."""
    root = Path(cfg.run_dir).resolve()
    path = (root / Path(*parts)).resolve() if parts else root
    if root != path and root not in path.parents:
        raise ValueError(f"output path {path} escapes run_dir {root}")
    return path


def cache_dir(cfg: DictConfig) -> str | None:
    return cfg.model.cache_dir


def group(cfg: DictConfig, name: str) -> Any:
    """The config group ``name`` as the dataclass the code takes (``LossConfig``, ``Tags``, ``EvalConfig``, ...)."""
    return OmegaConf.to_object(cfg[name])


def build_tags(cfg: DictConfig) -> Tags:
    return group(cfg, "tags")


def synthetic_world(cfg: DictConfig) -> SyntheticWorld:
    return SyntheticWorld.generate(cfg.data.world_seed)


def corpus_path(cfg: DictConfig) -> Path:
    """The BM25 corpus: ``env.corpus`` or the synthetic world's, written once into the cache."""
    if cfg.env.corpus:
        path = Path(cfg.env.corpus)
        if not path.is_file():
            raise FileNotFoundError(f"env.corpus: {path} does not exist")
        return path
    # The training world and its held-out world in one index (mempo.data.synthetic: the entity-level split).
    path = cache_root(cache_dir(cfg)) / "corpora" / f"synthetic-world-{cfg.data.world_seed}-with-heldout.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(path)
        synthetic_world(cfg).write_corpus(tmp, with_heldout=True)
        tmp.replace(path)
    return path


def build_env(cfg: DictConfig, tokenizer: Any) -> SearchEnv:
    e: EnvConfig = group(cfg, "env")
    if e.retriever == "bm25":
        kwargs: dict[str, Any] = {"path": corpus_path(cfg), "cache_dir": cache_root(cache_dir(cfg)) / "bm25"}
    elif e.retriever == "http":
        kwargs = {"url": e.url, "timeout_s": e.timeout_s, "max_retries": e.max_retries, "backoff_s": e.backoff_s}
        kwargs["max_queries_per_post"] = e.max_queries_per_post
    else:  # a user's factory (mempo.stages.plugins): the corpus the run searches
        kwargs = {"corpus": str(corpus_path(cfg))}
    retriever = make_retriever(e.retriever, **kwargs)
    if e.wait_s > 0 and hasattr(retriever, "wait_ready"):  # a Search-R1 server loads its index for minutes
        retriever.wait_ready(e.wait_s, say=say)
    return SearchEnv(
        retriever,
        tokenizer,
        topk=e.topk,
        max_passage_tokens=e.max_passage_tokens,
        max_obs_tokens=e.max_obs_tokens,
        render=e.render,
        information_tag=cfg.tags.information,
    )


def build_tasks(
    cfg: DictConfig, split: str, *, num_tasks: int | None = None, objectives: int | None = None
) -> list[Task]:
    """Tasks of ``split`` ("train", "val", "test") with ``data.objectives`` (or ``objectives``) questions each.
    Synthetic "val"/"test" tasks ask about the held-out world only (``split_questions``). qa_files: train_files,
    val_files or test_files; the tasks of pre-composed files with that many objectives come first, as they are,
    then the questions of question files composed by ``data.compose``. Default ids of files that share a stem carry
    their folders (``id_prefixes``); a task id given twice is an error naming both files.

    num_tasks: None = each question of the split once. For "val" and "test", more tasks than the split holds is
    an error naming the numbers; "train" reuses questions across epochs (``compose_tasks``). Fewer tasks than the
    pre-composed files hold are drawn from them by source with ``seed`` (``subset_by_source``); for qa_files'
    "val" and "test" one console line gives the tasks of each source.
    """
    n_obj = objectives or cfg.data.objectives
    if cfg.data.source == "synthetic":
        questions = [q.question for q in split_questions(synthetic_world(cfg), split, seed=cfg.seed)]
        return _select(cfg, split, [], questions, f"the synthetic world's {split} split", num_tasks, n_obj)
    key = {"train": "train_files", "val": "val_files", "test": "test_files"}[split]
    files = cfg.data[key]
    if not files:
        raise ValueError(f"data.{key} is empty (eval.split={split} reads it)")
    given: list[Task] = []
    questions: list[Question] = []
    origin: dict[str, str] = {}  # task id -> the file that gave it
    for f, id_prefix in zip(files, id_prefixes(files, f"data.{key}")):
        items = load_qa_items(f, id_prefix)
        if isinstance(items[0], Task):
            for t in items:
                if t.task_id in origin:
                    raise ValueError(
                        f"data.{key}: task id {t.task_id!r} is in {origin[t.task_id]} and in {f}: results are kept "
                        "by task id, so one of the two would be lost; give the tasks distinct task_id values"
                    )
                origin[t.task_id] = str(f)
            given += [t for t in items if len(t.objectives) == n_obj]
        else:
            questions += items
    if split == "test":
        check_disjoint(cfg, files, questions + [q for t in given for q in t.objectives])
    where = f"data.{key} ({len(files)} file(s))"
    tasks = _select(cfg, split, given, questions, where, num_tasks, n_obj)
    ids = {t.task_id for t in given}
    clash = next((t.task_id for t in tasks[len(given) :] if t.task_id in ids), None)
    if clash is not None:
        raise ValueError(
            f"data.{key}: task id {clash!r} of {origin[clash]} is also the id of a task composed from the question "
            f"files ({split}-n{n_obj}-k): rename the file or give its tasks task_id values"
        )
    if split != "train":
        holds = _capacity(given, questions, n_obj, cfg)
        say(
            f"[mempo] {split} tasks of N={n_obj} from {where}: {len(tasks)} of {holds} (seed {cfg.seed}), by source: "
            f"{source_counts(tasks)}"
        )
    return tasks


def _capacity(given: list[Task], questions: list[Question], n_obj: int, cfg: DictConfig) -> int:
    """Tasks of ``n_obj`` objectives a split holds: its pre-composed ones and one pass over its questions."""
    return len(given) + (task_capacity(questions, n_obj, cfg.data.compose) if len(questions) >= n_obj else 0)


def _select(
    cfg: DictConfig,
    split: str,
    given: list[Task],
    questions: list[Question],
    where: str,
    num_tasks: int | None,
    n_obj: int,
) -> list[Task]:
    """``build_tasks``' selection: the pre-composed ``given`` (fewer than they are: drawn by source with the seed,
    ``subset_by_source``), then tasks composed from ``questions`` by ``data.compose``."""
    holds = _capacity(given, questions, n_obj, cfg)
    if holds == 0:
        raise ValueError(f"{where}: no task of {n_obj} objectives ({len(questions)} questions, {len(given)} tasks)")
    if split != "train" and num_tasks is not None and num_tasks > holds:
        raise ValueError(
            f"{num_tasks} tasks of {n_obj} objectives asked of {where}, which holds {holds} "
            f"({len(questions)} questions, {len(given)} pre-composed tasks); lower eval.num_tasks / "
            "data.num_val_tasks, or set eval.num_tasks=null to use each question once"
        )
    if len(given) >= (num_tasks or holds) or len(questions) < n_obj:
        return subset_by_source(given, num_tasks, cfg.seed)
    rest = None if num_tasks is None else num_tasks - len(given)
    prefix, mode = f"{split}-n{n_obj}", cfg.data.compose
    return given + compose_tasks(questions, n_obj, num_tasks=rest, seed=cfg.seed, prefix=prefix, mode=mode)


def check_disjoint(cfg: DictConfig, test_files: Sequence[str], test: Sequence[Question]) -> None:
    """A test question whose normalised text is also in data.train_files or data.val_files is an error."""
    seen: dict[str, str] = {}
    for key in ("train_files", "val_files"):
        for f in cfg.data[key]:
            items = load_qa_items(f)
            for q in (q for t in items for q in t.objectives) if isinstance(items[0], Task) else items:
                seen.setdefault(normalize_answer(q.question), f"data.{key} file {f}")
    for q in test:
        if normalize_answer(q.question) in seen:
            raise ValueError(
                f"data.test_files ({', '.join(map(str, test_files))}): question {q.qid!r} ({q.question!r}) is also in "
                f"{seen[normalize_answer(q.question)]}: a test split must not overlap training or validation"
            )


def build_builder(cfg: DictConfig, tokenizer: Any) -> PromptBuilder:
    return PromptBuilder(tokenizer, build_tags(cfg))


def sampler_dtype(cfg: DictConfig) -> str:
    """The RL engine's dtype: ``sampler.dtype``, ``auto`` resolved by whether this machine has native bf16 kernels
    (``native_bf16``), whatever the trainer's precision."""
    return group(cfg, "sampler").engine_dtype(bf16=native_bf16(cfg.trainer.accelerator))


def resolve_old_logp(cfg: DictConfig) -> str:
    """``optim.old_logp=auto``: the sampler's log-probs when they are exact, i.e. the engine samples in float32
    (vLLM's ``sampler.dtype``, ``auto`` resolved; HF sampling runs the policy itself, in ``model.dtype``); otherwise a
    trainer forward recomputes them and ``loss.tis_cap`` corrects for the engine/trainer mismatch."""
    if cfg.optim.old_logp != "auto":
        return cfg.optim.old_logp
    dtype = cfg.model.dtype if cfg.sampler.backend == "hf" else sampler_dtype(cfg)
    return "sampler" if dtype == "float32" else "recompute"


def head_frozen(cfg: DictConfig) -> bool:
    """Whether the RL policy's output head takes no gradient (``trainable_policy``): LoRA adapters, or only the top
    ``model.train_top_layers`` layers train (the embeddings, and a head tied to them or not, stay frozen)."""
    return bool(cfg.model.lora.rank > 0 or cfg.model.train_top_layers)


def build_optim_config(cfg: DictConfig) -> OptimConfig:
    """The ``optim`` group with its ``auto`` values resolved: old_logp (``resolve_old_logp``); compile_update, on
    exactly when the old log-probs are recomputed (a bf16 engine) and the policy is not sharded (FSDP2); shared_prefix,
    on where the update runs on a CPU and is not sharded; head_grad_in_forward, on where shared_prefix's auto would be
    and the head is frozen (``head_frozen``). The last two passed their learning check on a Zen 4 EPYC (validation EM
    after 10 steps not lower at two seeds, docs/performance.md); not measured on GPUs, where auto leaves them off."""
    old_logp = resolve_old_logp(cfg)
    optim = group(cfg, "optim")
    unsharded = cfg.trainer.strategy != "fsdp2"
    compile_update = optim.compile_update
    if compile_update == "auto":
        compile_update = old_logp == "recompute" and unsharded
    cpu_update = cfg.trainer.accelerator == "cpu" and unsharded
    shared_prefix = cpu_update if optim.shared_prefix == "auto" else optim.shared_prefix
    head_fwd = optim.head_grad_in_forward
    if head_fwd == "auto":
        head_fwd = cpu_update and head_frozen(cfg)
    resolved = {"compile_update": compile_update, "shared_prefix": shared_prefix, "head_grad_in_forward": head_fwd}
    return replace(optim, old_logp=old_logp, **resolved)


def speed_settings_line(cfg: DictConfig) -> str:
    """The RL run's speed switches as this machine resolves them, each with its key: the engine's dtype
    (``sampler.dtype``), whether vLLM compiles it (``sampler.enforce_eager``, by the run's length), where the old
    log-probs come from and whether the update is compiled (``build_optim_config``), the update's precision
    (``trainer.precision``), its two switches that compute less (``optim.shared_prefix``,
    ``optim.head_grad_in_forward``), and the CPU kind they were resolved for (``mempo.core.hardware.rate_kind``)."""
    optim = build_optim_config(cfg)

    def key(v: Any) -> str:  # as it is written on the command line
        return str(v).lower() if isinstance(v, bool) else str(v)

    if cfg.sampler.backend == "vllm":
        eager = group(cfg, "sampler").engine_eager(int(cfg.trainer.max_steps))
        engine = f"engine {sampler_dtype(cfg)} (sampler.dtype={cfg.sampler.dtype}), "
        engine += f"{'eager' if eager else 'compiled'} (sampler.enforce_eager={key(cfg.sampler.enforce_eager)})"
    else:
        engine = f"sampler {cfg.sampler.backend}"
    compiled = "compiled" if optim.compile_update else "eager"
    t = cfg.trainer
    precision = resolve_precision(t.precision, t.accelerator)
    where = f" on a CPU of kind {rate_kind()}" if t.accelerator == "cpu" else ""
    return (
        f"{engine}; old log-probs {optim.old_logp} (optim.old_logp={cfg.optim.old_logp}); update {compiled} "
        f"(optim.compile_update={key(cfg.optim.compile_update)}) in {precision} (trainer.precision={t.precision}), "
        f"shared prefix {'on' if optim.shared_prefix else 'off'} (optim.shared_prefix={key(cfg.optim.shared_prefix)}), "
        f"head gradient in {'forward' if optim.head_grad_in_forward else 'backward'} "
        f"(optim.head_grad_in_forward={key(cfg.optim.head_grad_in_forward)}){where}"
    )


def build_sampler(
    cfg: DictConfig,
    model_path: str | Path,
    policy: Any = None,
    tokenizer: Any = None,
    *,
    dtype: str | None = None,
    logprobs: str | None = None,
    rl_steps: int | None = None,
) -> Sampler:
    """``sampler.backend``: vllm (an engine over the policy's folder, in ``dtype``, default sampler.dtype with
    ``auto`` resolved) or hf (generate with the policy itself); its log-probs ``logprobs``, default sampler.logprobs.
    rl_steps: the RL run's length, which ``sampler.enforce_eager=auto`` reads (None: not an RL run, eager)."""
    s: SamplerConfig = group(cfg, "sampler")
    logprobs = logprobs or s.logprobs
    if s.backend == "hf":
        from mempo.rollout.hf_sampler import HFSampler

        return HFSampler(policy, tokenizer, logprobs=logprobs)
    from mempo.rollout.vllm_sampler import VLLMSampler

    return VLLMSampler(
        str(model_path),
        dtype=dtype or sampler_dtype(cfg),
        enforce_eager=s.engine_eager(rl_steps),
        tensor_parallel_size=s.tensor_parallel_size,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_model_len=s.max_model_len,
        enable_sleep_mode=s.enable_sleep_mode,
        kv_cache_space_gb=s.kv_cache_space_gb,
        block_size=s.block_size,
        seed=cfg.seed,
        push_mode=s.push_mode,
        logprobs=logprobs,
        use_tqdm_on_load=cfg.verbose,  # the console shows third-party progress bars only when verbose
    )


def trainable_policy(policy: Any, m: ModelConfig) -> Any:
    """What trains (both stages): LoRA adapters (``model.lora.rank`` > 0; on the top ``train_top_layers`` layers
    when set), else the top layers, else everything; gradient checkpointing first, as LoRA needs to know of it."""
    if m.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    if m.lora.enabled:
        return apply_lora(policy, m.lora, top_layers=m.train_top_layers)
    train_top_layers(policy, m.train_top_layers)
    return policy


def check_lora_run(cfg: DictConfig, optim: OptimConfig) -> None:
    """LoRA dropout makes the trainer's forward differ from the engine's: refused where the engine's log-probs are
    the old ones (``optim.old_logp=sampler``)."""
    if cfg.model.lora.rank > 0 and cfg.model.lora.dropout > 0 and optim.old_logp == "sampler":
        raise ValueError(
            f"config key model.lora.dropout={cfg.model.lora.dropout}: with optim.old_logp=sampler the engine's "
            "log-probs (no dropout) are the old ones; set model.lora.dropout=0 or optim.old_logp=recompute"
        )


def build_module(cfg: DictConfig) -> tuple[MemPOModule, Path | str]:
    """-> (MemPOModule with its policy, reference (when loss.kl_coef > 0; with LoRA the policy's adapter disabled
    instead of a second model) and env, the policy's folder)."""
    m: ModelConfig = group(cfg, "model")
    optim = build_optim_config(cfg)
    check_lora_run(cfg, optim)
    model_path = resolve_model_path(m.name_or_path, cache_dir=m.cache_dir)
    policy, tokenizer = load_policy(model_path, dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    policy = trainable_policy(policy, m)
    reference = None
    if cfg.loss.kl_coef > 0 and not m.lora.enabled:
        reference, _ = load_policy(model_path, dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    module = MemPOModule(
        policy,
        tokenizer,
        build_env(cfg, tokenizer),
        reference=reference,
        builder=build_builder(cfg, tokenizer),
        agent=group(cfg, "agent"),
        sampling=group(cfg, "sampler").sampling(seed=cfg.seed),
        loss=group(cfg, "loss"),
        memory=group(cfg, "memory"),
        advantage=group(cfg, "advantage"),
        optim=optim,
        group_size=cfg.data.group_size,
        reward_kind=cfg.reward.kind,
        seed=cfg.seed,
        chains=synthetic_chains(cfg),
        logp_temperature=group(cfg, "sampler").logp_temperature,
        redraw_rounds=cfg.data.redraw_rounds if cfg.data.dynamic_sampling else 0,
        base_fingerprint=base_fingerprint(model_path) if m.lora.enabled else None,
    )
    return module, model_path


def synthetic_chains(cfg: DictConfig) -> dict[str, SyntheticQuestion] | None:
    """qid -> reasoning chain of every synthetic question (train, val and test); None for other data."""
    if cfg.data.source != "synthetic":
        return None
    world = synthetic_world(cfg)
    return {c.question.qid: c for split in SPLITS for c in split_questions(world, split, seed=cfg.seed)}


def build_eval_sampler(cfg: DictConfig, folder: str | Path) -> Sampler:
    """A sampler over a saved policy folder (evaluation of a checkpoint: greedy, untempered log-probs)."""
    if cfg.sampler.backend == "hf":
        policy, tokenizer = load_policy(folder, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
        return build_sampler(cfg, folder, policy, tokenizer, logprobs="raw")
    return build_sampler(cfg, folder, logprobs="raw")
