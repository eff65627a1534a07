"""The process layout comes from a backend that declares ``api.MultiProcess``, and only from it."""

from __future__ import annotations

import pytest

from star_engine.rundir import procs
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


def test_the_layout_is_a_value_each_store_holds(tmp_path):
    """No module-wide process context: a store given process 1 of 2 writes nothing and
    waits at the named barrier, while a one-process store beside it writes at once."""
    from star_engine.rundir.store import RunStore

    met: list[str] = []
    follower = RunStore(tmp_path / "a", {}, processes=procs.Processes(index=1, count=2, barrier=met.append))
    alone = RunStore(tmp_path / "b", {})
    follower.write_bytes(tmp_path / "a" / "x.json", b"{}")
    alone.write_bytes(tmp_path / "b" / "x.json", b"{}")
    assert not (tmp_path / "a" / "x.json").exists() and (tmp_path / "b" / "x.json").read_bytes() == b"{}"
    assert met == ["star-engine 1: write x.json"]
