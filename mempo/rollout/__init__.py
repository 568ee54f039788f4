"""mempo.rollout"""
