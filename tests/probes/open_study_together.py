"""Opens (creates or joins) a sweep's study the moment a start file appears, so two of these race on a
new storage as two sweep workers started together do. argv: storage URL, ready file, start file."""

import sys
import time
from pathlib import Path

from finetune.studies.storage import open_study
from finetune.studies.sweep_config import Param, SweepSpec

storage, ready, start = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not start.exists():  # the imports done, both processes wait here for the same moment
    time.sleep(0.005)
spec = SweepSpec(n_trials=2, search_space=(Param("learning_rate", "float", 1e-5, 1e-3),))
open_study(spec, "together", storage, "maximize", ready.parent)
print("joined")
