"""A run's settings: `TrainConfig` (train_config.py), read from flags and YAML (parser.py)."""
