"""Placeholder: filled in by the fedlamb work (registered by the registry already)."""
SPECS = ()
