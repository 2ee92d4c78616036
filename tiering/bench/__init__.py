"""Benchmarks (``tiering bench ...``): each measures ours and a reference side by side in one run
and prints JSON lines, the last one a summary object with a ``ratio`` (ours / reference)."""
