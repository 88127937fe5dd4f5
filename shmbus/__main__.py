"""``python -m shmbus``: the command line."""

from shmbus.cli import main

main()
