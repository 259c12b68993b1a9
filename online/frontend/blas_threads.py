"""Limit the BLAS thread pool of the running process (without threadpoolctl).

A 100k x 100 similarity query is a single small matrix product. With a second core
busy (training, another request), a 2-thread OpenBLAS turns a 1.5 ms query into 8 ms,
so the query path runs BLAS on one thread. Environment
variables such as OPENBLAS_NUM_THREADS only work before numpy is imported; this finds
the OpenBLAS that numpy actually loaded and calls its ``set_num_threads``.
"""
from __future__ import annotations

import ctypes

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads_64_",
            "scipy_openblas_set_num_threads", "openblas_set_num_threads64_", "openblas_set_num_threads",
            "MKL_Set_Num_Threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads_64_",
            "scipy_openblas_get_num_threads", "openblas_get_num_threads64_", "openblas_get_num_threads",
            "MKL_Get_Max_Threads")


def _loaded_blas_libraries() -> list[str]:
    import numpy  # noqa: F401 - make sure numpy's BLAS is loaded before looking for it

    paths: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6:
                    path = parts[-1]
                    name = path.rsplit("/", 1)[-1].lower()
                    if ("openblas" in name or "mkl_rt" in name) and path not in paths:
                        paths.append(path)
    except OSError:
        pass
    return paths


def set_blas_threads(n: int) -> list[str]:
    """Set every loaded OpenBLAS/MKL to ``n`` threads; returns the libraries changed."""
    changed = []
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                changed.append(path)
                break
    return changed


def get_blas_threads() -> int | None:
    """Threads of the first loaded OpenBLAS/MKL, or None if none was found."""
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _GETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return int(fn())
    return None
