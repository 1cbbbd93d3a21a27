"""A stand-in for NVIDIA's cuda-python, tests only (tests/standins/_standin_gpu.py).

A stand-in written from cuda-python's runtime API; it does not replace running on a real GPU. It
has both layouts: `cuda.bindings.runtime` (cuda-python >= 12.6, 13.x) and `cuda.cudart` (12.x).
"""
