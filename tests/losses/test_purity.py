import subprocess
import sys


def test_losses_import_only_torch():
    """mempo.losses is pure tensor math: importing it pulls in no transformers, lightning, vllm or hydra."""
    code = (
        "import sys, mempo.losses\n"
        "bad = [m for m in ('transformers', 'lightning', 'vllm', 'hydra', 'omegaconf', 'wandb') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
