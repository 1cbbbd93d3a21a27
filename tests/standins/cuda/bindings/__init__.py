"""A stand-in for cuda-python's `cuda.bindings` package (>= 12.6), tests only; not a real GPU."""
