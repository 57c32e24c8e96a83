"""The project's own adapters to the peer simulators it installs from package registries and
runs side by side with the engine (benchmarks/). No peer code is copied here."""
