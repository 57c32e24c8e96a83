"""Placeholder: filled in by the fedspeed work (registered by the registry already)."""
SPECS = ()
