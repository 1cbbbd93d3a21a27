"""A stand-in for `cuda.cudart` (the cuda-python 12.x layout), tests only.

A stand-in written from cuda-python's runtime API; it does not replace running on a real GPU.
"""

from _standin_gpu import *  # noqa: F403
