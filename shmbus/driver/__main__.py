"""``python -m shmbus.driver '<context json>'``: how ``connect()`` starts an embedded driver."""

import sys

from shmbus.driver.media_driver import run_driver
from shmbus.settings.context import Context

run_driver(Context.from_json(sys.argv[1]) if len(sys.argv) > 1 else Context(), embedded=True)
