"""Only the optional compiled parts live here; everything else is in setup.cfg.

edgeserve.scheduler._quick is the default policy's usual decision in C, edgeserve.net._shapes the
refusal of a flood's frames by shape, edgeserve.wire._infer the common infer request read from its
frame, edgeserve.net._answer the frame of an `ok` answer, edgeserve.runtime._nap the event loop's
wait for the executor thread's next batch (see their headers). All are optional: where no C
compiler is found the install goes on and Python (numpy, msgpack, a lock) does the same.
_quick is built with -ffp-contract=off: no fused multiply-adds, so its arithmetic rounds exactly
as Python's does.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "edgeserve.scheduler._quick",
            ["edgeserve/scheduler/_quick.c"],
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "edgeserve.runtime._nap",
            ["edgeserve/runtime/_nap.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "edgeserve.net._shapes",
            ["edgeserve/net/_shapes.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "edgeserve.wire._infer",
            ["edgeserve/wire/_infer.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "edgeserve.net._answer",
            ["edgeserve/net/_answer.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
