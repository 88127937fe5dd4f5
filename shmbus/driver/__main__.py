"""``python -m shmbus.driver '<context json>'``: how ``connect()`` starts an embedded driver."""

import sys

from shmbus.context import Context
from shmbus.driver.media_driver import run_driver

run_driver(Context.from_json(sys.argv[1]) if len(sys.argv) > 1 else Context(), embedded=True)
