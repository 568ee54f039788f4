"""Rollouts: the turn format and its parser, samplers, the agent loop, memory-span token masks and rewards."""
