"""Only the optional C kernel lives here; everything else is in pyproject.toml.

``online.search._int8_scan`` is the front end's int8 scoring loop (AVX-512 VNNI when the
CPU has it, chosen at run time). It is optional: where no C compiler is available the
build goes on without it and the front end scores with numpy/BLAS instead (same answers,
slower; ``/v1/stats`` and the startup log say which one runs).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("online.search._int8_scan", ["online/search/int8_scan.c"],
                             extra_compile_args=["-O3"], optional=True)])
