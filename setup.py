"""Only the optional compiled part lives here; everything else is in setup.cfg.

edgeserve.scheduler._quick is the default policy's usual decision in C (see its header). It is
optional: where no C compiler is found the install goes on and the Python path decides.
-ffp-contract=off: no fused multiply-adds, so its arithmetic rounds exactly as Python's does.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "edgeserve.scheduler._quick",
            ["edgeserve/scheduler/_quick.c"],
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        )
    ]
)
