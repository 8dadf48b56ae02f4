"""The model: loading, backbone fixes, LoRA, the optimizer, FLOPs."""
