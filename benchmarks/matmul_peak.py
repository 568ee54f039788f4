"""What this CPU's matmuls reach alone, at the shapes of the RL update's decoder layers, beside what the update got.

    python -m benchmarks.matmul_peak                      # SmolLM2-135M's layer shapes, 2,048 rows, bf16 and float32
    python -m benchmarks.matmul_peak --rows 1024 4096

Each shape (rows x in -> out of one of the decoder's linear layers: q/o 576 -> 576, k/v 576 -> 192, gate/up
576 -> 1536, down 1536 -> 576) is timed as a plain ``a @ b`` for ``--seconds`` after a warm-up, in bf16 and float32,
with torch's threads as they are (every core). The GFLOP/s are 2 x rows x in x out per call. Beside them: the matmul
work one update step does (``update_flops``) for the update profile's figures, so that "its matmuls took S seconds"
reads as a share of what the CPU can do. Run it with nothing else on the machine; it names the machine kind.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import RESULTS, log, write_json
from benchmarks.rl_throughput import machine_kind

# SmolLM2-135M: hidden 576, intermediate 1536, 9 query heads and 3 key-value heads of 64, 30 layers.
HIDDEN, INTERMEDIATE, KV, LAYERS = 576, 1536, 192, 30
SHAPES = {
    "q/o": (HIDDEN, HIDDEN),
    "k/v": (HIDDEN, KV),
    "gate/up": (HIDDEN, INTERMEDIATE),
    "down": (INTERMEDIATE, HIDDEN),
}
PER_LAYER = {"q/o": 2, "k/v": 2, "gate/up": 2, "down": 1}  # how many of each shape a layer holds


def layer_params() -> int:
    return sum(PER_LAYER[k] * a * b for k, (a, b) in SHAPES.items())


def update_flops(tokens: float, trained_layers: int, layers: int = LAYERS) -> float:
    """Matmul FLOPs of one update over ``tokens`` positions: the forward through every layer (2 per weight per token)
    and the backward through the trained top layers (4 per weight per token: the input's and the weight's gradients).
    The LM head and attention's own products are not in it (the profile counts them apart)."""
    return tokens * layer_params() * (2 * layers + 4 * trained_layers)


def gflops(rows: int, k: int, n: int, dtype: torch.dtype, seconds: float) -> float:
    a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    return 2 * rows * k * n * calls / (time.perf_counter() - start) / 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.matmul_peak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--rows", type=int, nargs="+", default=[2048])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", default=str(RESULTS / "matmul_peak.json"))
    args = parser.parse_args(argv)
    kind = machine_kind()
    log(f"machine: {kind['label']} ({kind['cpu']}), {kind['cores']} cores, torch threads {torch.get_num_threads()}")
    rows = []
    for n_rows in args.rows:
        for dtype in (torch.bfloat16, torch.float32):
            for name, (k, n) in SHAPES.items():
                rows.append({"rows": n_rows, "dtype": str(dtype).removeprefix("torch."), "shape": name,
                             "gflops": gflops(n_rows, k, n, dtype, args.seconds)})  # fmt: skip
    where = f"{kind['label']} ({kind['cpu']}), {kind['cores']} cores"
    print(f"\nMatmul GFLOP/s alone at the update's layer shapes; {where}\n")
    print("| rows | dtype | " + " | ".join(SHAPES) + " | layer-weighted |")
    print("| --- | --- | " + " | ".join("---" for _ in SHAPES) + " | --- |")
    for n_rows in args.rows:
        for dtype in ("bfloat16", "float32"):
            got = {r["shape"]: r["gflops"] for r in rows if r["rows"] == n_rows and r["dtype"] == dtype}
            # A layer's time is its FLOPs over each shape's rate: the rate a whole layer's matmuls run at.
            flops = {s: PER_LAYER[s] * a * b for s, (a, b) in SHAPES.items()}
            layer = sum(flops.values()) / sum(flops[s] / got[s] for s in SHAPES)
            print(f"| {n_rows} | {dtype} | " + " | ".join(f"{got[s]:.0f}" for s in SHAPES) + f" | {layer:.0f} |")
    per_position = update_flops(1, 8) / 1e6
    print(f"\nOne update's decoder matmuls: {per_position:.0f} MFLOP a position with the top 8 of 30 layers trained "
          "(forward through all, backward through the top 8)")  # fmt: skip
    write_json(args.json, {"machine": kind, "rows": rows, "seconds": args.seconds})


if __name__ == "__main__":
    main()
