"""The process layout comes from a backend that declares ``api.MultiProcess``, and only from it."""

from __future__ import annotations

import pytest

from star_engine import procs
from star_engine.api import MultiProcess


class Single:
    def generate(self, *a):
        return []


class Two:
    def __init__(self, index=1):
        self.index, self.met = index, []

    def process_index(self):
        return self.index

    def process_count(self):
        return 2

    def barrier(self, name):
        self.met.append(name)


class CountOnly:
    def process_count(self):
        return 2


@pytest.fixture(autouse=True)
def restore():
    saved = procs.CURRENT
    yield
    procs.CURRENT = saved


def test_a_backend_without_the_protocol_is_one_process():
    assert not isinstance(Single(), MultiProcess)
    p = procs.configure(Single())
    assert (p.index, p.count, p.primary) == (0, 1, True)
    p.sync("nothing to wait for")


def test_a_multiprocess_backend_gives_the_layout_and_its_barrier():
    b = Two()
    assert isinstance(b, MultiProcess)
    p = procs.configure(b)
    assert (p.index, p.count, p.primary) == (1, 2, False)
    p.sync("wrote x")
    assert b.met == ["star-engine 1: wrote x"]


@pytest.mark.parametrize("backend, error", [(CountOnly(), TypeError), (Two(index=2), ValueError)])
def test_an_incomplete_or_inconsistent_layout_is_refused(backend, error):
    with pytest.raises(error, match="MultiProcess|outside"):
        procs.configure(backend)
