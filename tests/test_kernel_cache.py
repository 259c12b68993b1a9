"""The kernel cache's start-up side (``online.learner.kernel_cache``): the seed copied into an empty cache directory,
files already there kept, the CPU the seed was made for compared with this one, a directory it cannot write
reported instead of stopping the process, and numba's compiles counted. The image's own cache, built and run in a
container, is tested in tests/test_deploy_containers.py."""
from __future__ import annotations

import json

from numba import njit

from online.learner import kernel_cache


def _seed(tmp_path, cpu: dict) -> tuple:
    seed = tmp_path / "seed"
    (seed / "learner_abc").mkdir(parents=True)
    (seed / "learner_abc" / "k.nbi").write_bytes(b"index")
    (seed / "learner_abc" / "k.1.nbc").write_bytes(b"code")
    (seed / kernel_cache.MANIFEST).write_text(json.dumps({"cpu": cpu}))
    return seed, tmp_path / "cache"


def test_the_seed_is_copied_where_absent_and_what_is_there_is_kept(tmp_path):
    seed, cache = _seed(tmp_path, kernel_cache.host_cpu())
    done = kernel_cache.seed_cache(str(cache), seed)
    assert (done.copied, done.kept, done.same_cpu, done.error) == (2, 0, True, "")
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) == \
        ["learner_abc/k.1.nbc", "learner_abc/k.nbi"]            # the manifest stays in the seed
    (cache / "learner_abc" / "k.nbi").write_bytes(b"grown by a compile")
    again = kernel_cache.seed_cache(str(cache), seed)
    assert (again.copied, again.kept) == (0, 2)
    assert (cache / "learner_abc" / "k.nbi").read_bytes() == b"grown by a compile"


def test_a_seed_made_for_another_cpu_is_told_apart(tmp_path):
    seed, cache = _seed(tmp_path, {"name": "another-cpu", "features": "+avx512f"})
    done = kernel_cache.seed_cache(str(cache), seed)
    assert done.same_cpu is False and done.built_for == "another-cpu"


def test_no_seed_and_an_unwritable_directory_copy_nothing_and_raise_nothing(tmp_path):
    assert kernel_cache.seed_cache(str(tmp_path / "cache"), tmp_path / "absent").seed == ""
    seed, _cache = _seed(tmp_path, kernel_cache.host_cpu())
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    done = kernel_cache.seed_cache(str(blocked), seed)
    assert done.copied == 0 and done.error


def test_each_compile_is_counted_once_however_deep():
    @njit
    def inner(x):
        return x + 1

    @njit
    def outer(x):
        return inner(x) * 2

    watch = kernel_cache.watch()
    before = watch.totals()[0]
    assert outer(1) == 4
    assert watch.totals()[0] == before + 1    # outer, with inner compiled inside it
    assert outer(2) == 6 and watch.totals()[0] == before + 1
