"""The training stages: ``rl`` (MemPO, or GRPO by config, from ``model.name_or_path``) and ``sft`` (the supervised
warm start on teacher trajectories), and the Lightning Trainer both run under."""

from __future__ import annotations

import shutil
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from mempo.core.base import temp_sibling, wandb_mode, write_json
from mempo.core.console import say
from mempo.core.hardware import bound_onednn_caches, set_mmap_threshold
from mempo.data.datamodule import RedrawStream, TaskDataModule, per_rank_batch, tasks_per_step_line
from mempo.data.oracle import load_trajectories_jsonl, oracle_dataset
from mempo.eval.curves import plot_runs
from mempo.eval.memory_credit import CREDIT_FILE
from mempo.eval.tables import have_matplotlib
from mempo.lm.loading import load_policy, resolve_model_path
from mempo.lm.lora import apply_lora, export_states, is_lora, save_lora
from mempo.lm.sharding import is_sharded
from mempo.models.callbacks import (
    HFSnapshots,
    HostMemory,
    MemoryCreditFile,
    MetricsFile,
    RLProgress,
    SamplerCallback,
    SFTProgress,
    StepCheckpoint,
    ValidationCallback,
)
from mempo.models.module import MemPOModule
from mempo.models.parallel import FSDP2Strategy, full_state_dict
from mempo.models.profiling import UpdateProfiler
from mempo.models.sft import SFTExample, SFTModule, SFTSequence, build_sft_examples, pack_turns, sft_dataloader
from mempo.rollout.retrievers import RetrieverError
from mempo.stages.builders import (
    build_builder,
    build_env,
    build_module,
    build_sampler,
    build_tags,
    build_tasks,
    group,
    run_path,
    sampler_dtype,
    speed_settings_line,
    synthetic_world,
)
from mempo.stages.config import check_paths, require_teacher, resolve_precision
from mempo.stages.reuse import check_reuse, write_config
from mempo.stages.rundir import claim_run_dir, run_record
from mempo.stages.steps import stage

# Lightning notices that do not apply here: modules are switched between eval (rollouts, scoring) and train (the
# update) by the module itself; batches are lists of tasks, which the module keeps on the host on purpose.
for _message in (
    r".*module\(s\) in eval mode at the start of training.*",
    r".*overridden `transfer_batch_to_device`.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
):
    warnings.filterwarnings("ignore", message=_message)


def _seed(cfg: DictConfig) -> None:
    L.seed_everything(cfg.seed, workers=True, verbose=False)


def _rank_zero() -> bool:
    """Whether this process is rank zero (Lightning's rank from the launcher's environment; a single process is)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank == 0


def _claim(cfg: DictConfig, stage: str) -> Path:
    """run_dir, refused when it holds another run unless resume or overwrite says what to do with it
    (``mempo.stages.rundir.claim_run_dir``), and on resume when the run's config or warm start changed since
    (``mempo.stages.reuse.check_reuse``); under DDP/FSDP only rank zero deletes what overwrite replaces."""
    out = run_path(cfg)
    mode = claim_run_dir(out, stage=stage, resume=cfg.resume, overwrite=cfg.overwrite, remove=_rank_zero())
    if mode == "resume":  # continued only under the config and from the weights it started with
        for note in check_reuse(stage, out, cfg, stage=stage, resume=True):
            say(f"[mempo] {stage}: resuming {out}: {note}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _logger(cfg: DictConfig, out: Path) -> Any:
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    if cfg.logger.kind == "csv":
        return CSVLogger(save_dir=str(out), name="lightning_logs")
    mode = wandb_mode(cfg.logger.mode)
    return WandbLogger(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        save_dir=str(out),
        mode=mode,
        tags=list(cfg.logger.tags),
        name=cfg.name,
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def make_trainer(cfg: DictConfig, out: Path, callbacks: list, **run: Any) -> L.Trainer:
    """``lightning.Trainer(**trainer group, **run)``: every key of the ``trainer`` group is a Trainer keyword (its
    precision ``auto`` resolved), ``run`` the phase's own (max_steps, max_epochs); the rest is fixed here."""
    kwargs = asdict(group(cfg, "trainer"))
    kwargs["precision"] = resolve_precision(kwargs["precision"], kwargs["accelerator"])
    if kwargs["strategy"] == "fsdp2":
        kwargs["strategy"] = FSDP2Strategy()
    return L.Trainer(
        **{**kwargs, **run},
        logger=_logger(cfg, out),
        callbacks=callbacks,
        enable_checkpointing=False,  # StepCheckpoint writes last.ckpt
        default_root_dir=str(out),
        enable_progress_bar=False,  # the phase's own bar (mempo.models.callbacks.PhaseProgress)
        enable_model_summary=cfg.verbose,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )


def _export(policy: Any, tokenizer: Any, folder: Path, *, write: bool, state: dict | None = None) -> Path:
    """The trained policy as a Hugging Face folder (what the next phase, vLLM and eval load). Every rank calls it
    (a sharded policy is gathered by all, unless ``state`` holds its gathered weights); the one with ``write``
    writes. A LoRA policy: ``folder`` holds the merged model (a plain HF folder) and ``<folder>_adapter`` peft's
    adapter (``mempo.lm.lora.save_lora``)."""
    if is_lora(policy):
        return _export_lora(policy, tokenizer, folder, write=write, states=state)
    state = state if state is not None else full_state_dict(policy)
    if not write:
        return folder
    tmp = temp_sibling(folder)
    policy.save_pretrained(tmp, safe_serialization=True, state_dict=state)
    tokenizer.save_pretrained(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.replace(folder)
    return folder


def _export_lora(policy: Any, tokenizer: Any, folder: Path, *, write: bool, states: dict | None) -> Path:
    if states is None and (write or is_sharded(policy)):  # sharded: every rank gathers
        states = export_states(policy)
    if not write:
        return folder
    adapter = folder.with_name(f"{folder.name}_adapter")
    tmp, tmp_adapter = temp_sibling(folder), temp_sibling(adapter)
    save_lora(policy, tmp, tmp_adapter, states)
    tokenizer.save_pretrained(tmp)
    for done, final in ((tmp, folder), (tmp_adapter, adapter)):
        if final.exists():
            shutil.rmtree(final)
        done.replace(final)
    return folder


def fit_or_stop_all(trainer: L.Trainer, module: Any, data: Any, ckpt_path: str | None) -> None:
    """``trainer.fit``; when it raises on the rank that launched the others (Lightning's rank 0 starts ranks 1..W-1
    as child processes), the children are killed before the error propagates, as Lightning does on Ctrl-C. A rank
    waiting in an NCCL collective for a peer that is gone waits until the process-group timeout (30 min); over gloo
    it fails at once (tests/models/parallel/test_failing_rank.py measured 3-4 s on two CPU processes, with or without
    this). A child that fails is seen by rank 0's Lightning observer, which kills every process."""
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    try:
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    except BaseException:
        launcher = getattr(trainer.strategy, "launcher", None)
        if isinstance(launcher, _SubprocessScriptLauncher) and launcher.procs:
            launcher.kill(signal.SIGKILL)
        raise


@stage("rl")
def train_rl(cfg: DictConfig) -> dict[str, Any]:
    print(f"[mempo] rl: {cfg.trainer.max_steps} RL steps from {cfg.model.name_or_path}")
    summary = fit_rl(cfg)[1]
    print(f"[mempo] rl: done in {summary['wall_s']:.0f} s; policy {summary['hf_folder']}, curves {summary['curves']}")
    return summary


def fit_rl(
    cfg: DictConfig, *, make_sampler: Callable[[Any], Any] | None = None, callbacks: Sequence[Any] = ()
) -> tuple[MemPOModule, dict[str, Any]]:
    """Train with MemPO (or the configured estimator) -> (the module, the run summary).

    make_sampler: module -> Sampler; default: ``sampler.backend`` over the policy (tests pass a scripted one).
    callbacks: extra Lightning callbacks, run after the built-in ones (benchmarks time steps with one).
    A retriever that stays down (``RetrieverError`` after its retries) stops the run after saving the last
    completed step (``StepCheckpoint.on_exception``); rerun with ``resume=true`` once the server is back.
    A run_dir that holds another run is refused before anything is written unless resume=true continues it or
    overwrite=true replaces it (``mempo.stages.rundir.RunDirError``).
    """
    start = time.perf_counter()
    check_paths(cfg)
    out = _claim(cfg, "rl")
    host = group(cfg, "host")
    bound_onednn_caches(host.onednn_cache_capacity)  # acts where nothing has run a oneDNN matmul yet (a direct caller)
    threshold = host.threshold_mb(cfg.trainer.max_steps)
    if threshold is not None:
        set_mmap_threshold(threshold)
    _seed(cfg)
    # Data before the model: a malformed or empty dataset fails in seconds, not after the model loads.
    data = TaskDataModule(build_tasks(cfg, "train"), [], batch_size=cfg.data.batch_size, seed=cfg.seed)
    if _rank_zero():  # with the fingerprint of the weights it starts from (materializes an embedded model)
        write_config(out, cfg)
    module, model_path = build_module(cfg)
    if module.redraw_rounds:  # dynamic sampling's extra tasks: the training pool, keyed by (step, round, rank)
        module.redraw = RedrawStream(data.train_tasks, seed=cfg.seed)
    ckpt = StepCheckpoint(out / "checkpoints", cfg.ckpt.every_n_steps)

    if make_sampler is None:

        def make_sampler(mod: Any) -> Any:
            return build_sampler(cfg, model_path, mod.policy, mod.tokenizer, rl_steps=cfg.trainer.max_steps)

    s = group(cfg, "sampler")
    engine_dtype = cfg.model.dtype if s.backend == "hf" else sampler_dtype(cfg)
    hooks: list[Any] = [
        SamplerCallback(
            make_sampler,
            sync_every=s.sync_every,
            canary_every=s.canary_every,
            canary_tol=s.canary_tolerance(engine_dtype),
            canary_tokens=s.canary_tokens,
        )
    ]
    if cfg.eval.every_n_steps > 0:  # after the weight push, before MetricsFile writes the step's row
        val_tasks = build_tasks(cfg, "val", num_tasks=cfg.data.num_val_tasks)
        hooks.append(ValidationCallback(val_tasks, cfg.eval.every_n_steps, reward_kind=cfg.reward.kind))
    if cfg.ckpt.hf_every_n_steps > 0:  # a learning curve's checkpoints, each an HF folder

        def snapshot(folder: Path, write: bool) -> Path:
            return _export(module.policy, module.tokenizer, folder, write=write)

        hooks.append(HFSnapshots(out / "hf_steps", cfg.ckpt.hf_every_n_steps, snapshot))
    if host.profile_update_steps:
        hooks.append(UpdateProfiler(host.profile_update_steps, out / "profile", {"engine_dtype": engine_dtype}))
    hooks += [
        HostMemory(host.release_every, host.rss_warn_growth),
        MetricsFile(out / "metrics.csv"),
        MemoryCreditFile(out / CREDIT_FILE),
        ckpt,
        RLProgress(cfg.trainer.max_steps),
        *callbacks,
    ]
    # trainer.max_steps counts RL steps; Lightning counts optimizer steps (ppo_epochs per RL step).
    trainer = make_trainer(cfg, out, hooks, max_steps=cfg.trainer.max_steps * cfg.optim.ppo_epochs, max_epochs=-1)
    per_rank_batch(cfg.data.batch_size, trainer.world_size)  # ranks share data.batch_size: refused before the fit
    tasks_line = tasks_per_step_line(cfg.data.batch_size, trainer.world_size)
    if trainer.is_global_zero:
        print(f"[mempo] rl: {tasks_line}, G={cfg.data.group_size} rollouts each")
        print(f"[mempo] rl: {speed_settings_line(cfg)}")
    ckpt_path = None
    if cfg.resume:
        if ckpt.last_path.exists():
            ckpt_path = str(ckpt.last_path)
            print(f"[mempo] resuming from {ckpt_path}")
        else:
            print(f"[mempo] resume=true but {ckpt.last_path} does not exist: starting from the beginning")
    try:
        fit_or_stop_all(trainer, module, data, ckpt_path)
    except RetrieverError as e:
        saved = f"step {ckpt.saved_at} is saved in {ckpt.last_path}" if ckpt.saved_at >= 0 else "no checkpoint"
        raise RetrieverError(
            f"run stopped at step {module.batches_done + 1}: {e} ({saved}; rerun with resume=true once "
            f"{e.url} answers)",
            url=e.url,
            attempts=e.attempts,
            last_error=e.last_error,
        ) from e
    hf = _export(module.policy, module.tokenizer, out / "hf", write=trainer.is_global_zero, state=module.final_state)
    curves = None
    if trainer.is_global_zero and (out / "metrics.csv").is_file():
        if have_matplotlib():
            curves = str(plot_runs([out], out / "curves.png", labels=[cfg.name]))
        else:
            print("[mempo] rl: matplotlib is not installed: no curves.png (metrics.csv holds the curves' data)")
    summary = {
        "stage": "rl",
        "name": cfg.name,
        "steps": module.batches_done,
        "tasks_per_step": tasks_line,
        "wall_s": time.perf_counter() - start,
        "hf_folder": str(hf),
        "checkpoint": str(ckpt.last_path),
        "curves": curves,
        "last_metrics": module.last_metrics,
        **run_record(cfg),
    }
    if trainer.is_global_zero:
        write_json(out / "summary.json", summary)
    return module, summary


def sft_data(cfg: DictConfig, tokenizer: Any) -> tuple[list, list[SFTExample], list[SFTSequence], DataLoader]:
    """The warm start's data as the sft stage trains on it -> (teacher trajectories, their turns replayed through the
    agent's prompt builder and environment, the training rows, the loader whose batches are the optimizer steps in
    order). tests/models/sft/test_sft_pin.py pins these batches on a small config."""
    s = cfg.sft
    require_teacher(cfg)
    if s.trajectories:
        trajectories = load_trajectories_jsonl(s.trajectories)
    else:  # one task set per entry of sft.objectives (e.g. [1, 2]: single- and two-question tasks mixed)
        trajectories = [
            item
            for n_obj in (s.objectives or [cfg.data.objectives])
            for item in oracle_dataset(
                synthetic_world(cfg), "train", n_obj, num_tasks=s.num_tasks, seed=cfg.seed, tags=build_tags(cfg)
            )
        ]
    examples = build_sft_examples(
        trajectories,
        build_builder(cfg, tokenizer),
        build_env(cfg, tokenizer),
        context=cfg.agent.context,
        keep_previous_turn=cfg.agent.keep_previous_turn,
        tags=build_tags(cfg),
    )
    rows = pack_turns(examples, pack=s.pack_turns)
    loader = sft_dataloader(rows, batch_size=s.batch_size, pad_id=tokenizer.pad_token_id, seed=cfg.seed)
    return trajectories, examples, rows, loader


@stage("sft")
def train_sft(cfg: DictConfig) -> dict[str, Any]:
    start = time.perf_counter()
    out = _claim(cfg, "sft")
    _seed(cfg)
    if _rank_zero():
        write_config(out, cfg)
    m, s = cfg.model, cfg.sft
    policy, tokenizer = load_policy(
        resolve_model_path(m.name_or_path, cache_dir=m.cache_dir), dtype=m.dtype, trust_remote_code=m.trust_remote_code
    )
    if m.gradient_checkpointing:  # long full-history examples: activations of one layer at a time in backward
        policy.gradient_checkpointing_enable()
    if m.lora.rank > 0:  # the warm start trains the adapters too (on the top train_top_layers layers when set)
        policy = apply_lora(policy, group(cfg, "model").lora, top_layers=m.train_top_layers)
    trajectories, examples, rows, loader = sft_data(cfg, tokenizer)
    total = len(loader) * s.epochs if s.max_steps < 0 else min(s.max_steps, len(loader) * s.epochs)
    module = SFTModule(
        policy,
        lr=s.lr,
        weight_decay=s.weight_decay,
        warmup_steps=s.warmup_steps,
        total_steps=total,
        lr_schedule=s.lr_schedule,
        min_lr_ratio=s.min_lr_ratio,
    )
    trainer = make_trainer(cfg, out, [SFTProgress(total)], max_steps=s.max_steps, max_epochs=s.epochs)
    trainer.fit(module, train_dataloaders=loader)
    hf = _export(policy, tokenizer, out / "hf", write=trainer.is_global_zero)
    summary = {
        "stage": "sft",
        "examples": len(examples),
        "rows": len(rows),
        "trajectories": len(trajectories),
        "steps": trainer.global_step,
        "final_loss": float(trainer.callback_metrics.get("sft/loss", float("nan"))),
        "losses": module.losses,
        "tokens": module.tokens_seen,
        "target_tokens": module.target_tokens_seen,
        "train_s": module.train_s,
        "tok_per_s": module.tokens_seen / max(module.train_s, 1e-9),
        "wall_s": time.perf_counter() - start,
        "hf_folder": str(hf),
        **run_record(cfg),
    }
    print(
        f"[mempo] warm start: {len(trajectories)} teacher tasks, {len(examples)} turns in {len(rows)} rows, "
        f"{trainer.global_step} steps, "
        f"{summary['tok_per_s']:.0f} tok/s, final loss {summary['final_loss']:.3f}"
    )
    if trainer.is_global_zero:
        write_json(out / "summary.json", summary)
    return summary
