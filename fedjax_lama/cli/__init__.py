"""What the command-line tools share (experiments/ and benchmarks/): the --cpu_devices flag and
the console output. Nothing here imports JAX, so the commands' --help stays fast."""
