"""One module per ``python -m benchmarks`` scenario; each imports only ``benchmarks.harness``."""
