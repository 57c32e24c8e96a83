"""Round programs: how the training loop drives the engine (see programs/round_program.py)."""
