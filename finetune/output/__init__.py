"""The output folder: its lock and pre-run checks, writes, the exported model, model card, plots,
metrics log and trackers."""
