"""``python -m tiering``: the same as the ``tiering`` command."""

from tiering.cli.main import main

main()
