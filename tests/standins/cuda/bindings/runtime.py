"""A stand-in for `cuda.bindings.runtime` (cuda-python >= 12.6, 13.x), tests only.

A stand-in written from cuda-python's runtime API; it does not replace running on a real GPU.
"""

from _standin_gpu import *  # noqa: F403
