"""The sidecar: the loops that copy segments, enforce retention and sweep (policy; bytes live in
``tiering.copier`` and state in ``metadata``)."""
