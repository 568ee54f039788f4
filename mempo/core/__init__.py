"""The bottom floor: plain types and helpers every layer uses, importing no other mempo folder.

tasks     Task and Question, the answer separator
format    the turn format: tags, parse_turn / format_turn
padding   right padding and placement of token rows
base      atomic writes, config checks (require, one_of), timing, the W&B mode
console   the quiet console: library logs to the run log, progress bars
jax_guard JAX (started by bm25s's import) kept off the GPU
hardware  what this machine's CPU can do
"""
