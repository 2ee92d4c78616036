"""The ``tiering`` command line."""
