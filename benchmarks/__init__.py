"""The benchmark scripts, run as modules from the repository root: ``python -m benchmarks.run`` (the suite) or
``python -m benchmarks.<name>`` (one script; see each module's docstring). Shared helpers are in
``benchmarks.common``."""
