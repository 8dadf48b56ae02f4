"""Several processes: the Accelerator, ranks, stop signals."""
