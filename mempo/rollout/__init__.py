"""Rollouts: samplers (vLLM, HF), the agent loop with context reset, prompts, memory-span token masks, the
search environment and its retrievers, rewards."""
