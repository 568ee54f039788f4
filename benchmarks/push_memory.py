"""Trainer-side memory of the weight push from an FSDP2-sharded policy, on two CPU processes (gloo).

    python -m benchmarks.push_memory                          # SmolLM2-135M, fp32 shards, bf16 engine dtype
    python -m benchmarks.push_memory --model tiny

Each rank shards the policy (``mempo.lm.sharding.shard_model``) and then pushes it twice into a consumer that casts
each tensor to the engine's dtype and drops it, as ``VLLMSampler.push_weights`` feeds vLLM's loader: once streamed
(``full_tensors``: one gathered tensor at a time, what ``SamplerCallback`` does) and once materialized (every full
tensor gathered into one dict first, the naive ``{k: v.full_tensor()}``). A polling thread samples the resident set
size (RSS); rank 0 prints each way's peak growth over the sharded baseline beside the largest tensor and the full
model size. The engine side (vLLM's own copy of the weights in its dtype, written in place by its loader) is not
in these figures: it is the engine's weights, allocated once when the engine starts (``sampler.dtype`` x params).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

import torch


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The largest RSS seen while the block runs, sampled every millisecond."""

    def __enter__(self) -> PeakRSS:
        self.base, self.peak, self._run = _rss(), _rss(), True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while self._run:
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._run = False
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _consume(pairs: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> None:
    for _, t in pairs:
        t.to(dtype).sum()  # the engine-dtype copy the loader reads, then dropped


def rank_main(model: str, dtype: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from mempo.lm.loading import load_policy, resolve_model_path
    from mempo.lm.sharding import full_tensors, shard_model

    dist.init_process_group("gloo")
    policy, _ = load_policy(resolve_model_path(model), dtype="float32")
    shard_model(policy, init_device_mesh("cpu", (dist.get_world_size(),)))
    engine_dtype = getattr(torch, dtype)
    full_bytes = sum(p.numel() * 4 for p in policy.state_dict().values())
    largest = max(p.numel() * 4 for p in policy.state_dict().values())
    results = {}
    # Streamed first, in a fresh process: its figure includes the allocator's warm-up (an upper bound); the
    # materialized push after it can reuse at most one tensor's worth of that memory.
    for way in ("streamed", "materialized"):
        dist.barrier()
        with PeakRSS() as m:
            if way == "streamed":
                _consume(full_tensors(policy.state_dict()), engine_dtype)
            else:
                full = dict(full_tensors(policy.state_dict()))
                _consume(full.items(), engine_dtype)
                del full
        results[way] = m.peak - m.base
    if dist.get_rank() == 0:
        mib = 2**20
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
        flags = "avx512_bf16" if "avx512_bf16" in cpu else "avx2 only"
        print(f"machine: {name} ({flags}); model {model}; 2 ranks (gloo); engine dtype {dtype}")
        print(f"full model (fp32): {full_bytes / mib:.1f} MiB; largest tensor (fp32): {largest / mib:.1f} MiB")
        for way in ("streamed", "materialized"):
            grow = results[way]
            print(f"push {way:>12}: peak RSS growth {grow / mib:8.1f} MiB = {grow / largest:5.2f} x largest tensor, "
                  f"{grow / full_bytes:5.2f} x model")  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.push_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16", help="the engine's dtype (sampler.dtype)")
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank >= 0:
        rank_main(args.model, args.dtype)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, "-m", "benchmarks.push_memory", "--model", args.model, "--dtype", args.dtype]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], env={**env, "RANK": str(r)}) for r in (0, 1)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
