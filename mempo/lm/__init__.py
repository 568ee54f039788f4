"""Model utilities, no training: loading a policy (HF folder, GGUF, tiny), token log-probs, answer scoring."""
