"""Capacity: whether a run fits a GPU's memory, planned from the config before anything is allocated.

``gpu_memory`` estimates each phase's bytes (weights, gradients, optimizer moments, activations, the engine's KV
cache) for a recipe on N GPUs; ``experiments/plan.py`` prints that plan and its verdict against ``plan.gpu_gib``.
Not the agent's ``<mem>`` memory: this folder is about accelerator memory only.
"""
