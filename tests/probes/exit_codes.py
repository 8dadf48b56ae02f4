"""A worker that exits with $CODES' entry for its rank ("143,143": both 143), rank 0 after $DELAY_S
seconds (so the other rank's exit is the one the launcher sees first)."""

import os
import sys
import time

rank = int(os.environ["RANK"])
if rank == 0:
    time.sleep(float(os.environ.get("DELAY_S", "0")))
sys.exit(int(os.environ["CODES"].split(",")[rank]))
