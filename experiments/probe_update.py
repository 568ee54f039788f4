"""How far an RL run moved a policy, and a random control of the same size.

    python experiments/probe_update.py BASE_HF TRAINED_HF [--lr 3e-5] [--control OUT_HF --seed 0]

Prints, for the parameters that changed: how many there are, the update's RMS and its RMS in units of the learning
rate (AdamW's first steps move a weight by about lr x sign(gradient), whatever the gradient's size), the fraction of
weights that moved by at least lr / 2, and the relative change ||dW|| / ||W||. With --control, writes a copy of BASE
moved by a random-sign update with each tensor's RMS equal to the trained update's (OUT_HF, a plain HF folder to
evaluate beside the two): if the control loses as much held-out EM as the trained policy, the loss comes from the
update's size, not its direction.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def load(folder: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def update_stats(base: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], lr: float) -> dict[str, float]:
    """Over the tensors that differ: parameters, RMS of the update (and / lr), fraction moved >= lr/2, ||dW||/||W||."""
    deltas = {k: trained[k] - base[k] for k in base if not torch.equal(trained[k], base[k])}
    if not deltas:
        return {"tensors": 0.0, "params": 0.0}
    flat = torch.cat([d.flatten() for d in deltas.values()])
    w = torch.cat([base[k].flatten() for k in deltas])
    rms = float(flat.pow(2).mean().sqrt())
    return {
        "tensors": float(len(deltas)),
        "params": float(flat.numel()),
        "rms": rms,
        "rms_over_lr": rms / lr,
        "moved_half_lr": float((flat.abs() >= lr / 2).float().mean()),
        "rel_change": float(flat.norm() / w.norm()),
    }


def random_control(
    base: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], seed: int
) -> dict[str, torch.Tensor]:
    """BASE plus, on each tensor the trained run changed, random signs scaled to that tensor's update RMS."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, w in base.items():
        d = trained[k] - w
        if torch.equal(trained[k], w):
            out[k] = w.clone()
            continue
        signs = torch.randint(0, 2, w.shape, generator=g).to(w.dtype) * 2 - 1
        out[k] = w + signs * d.pow(2).mean().sqrt()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("trained")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--control", default=None, help="write the random-sign control here")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    base_model, trained = load(a.base), load(a.trained)
    base = {k: v.detach().clone() for k, v in base_model.state_dict().items()}
    stats = update_stats(base, trained.state_dict(), a.lr)
    print(" ".join(f"{k}={v:.4g}" for k, v in stats.items()))
    if a.control:
        base_model.load_state_dict(random_control(base, trained.state_dict(), a.seed))
        out = Path(a.control)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(a.base, out)  # tokenizer, chat template, generation config as the base has them
        base_model.save_pretrained(out)
        print(f"control: {out}")


if __name__ == "__main__":
    main()
