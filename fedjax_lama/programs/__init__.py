"""Round programs: how the training loop drives the engine (see programs/common.py)."""
