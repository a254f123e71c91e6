"""free_port never hands out a port twice in one process: a plan picks several before any is bound."""

import pytest

from services.common import ports


def test_free_port_never_repeats_a_port_it_picked(monkeypatch):
    monkeypatch.setattr(ports, "_LOW", 30990)
    monkeypatch.setattr(ports, "_HIGH", 30993)
    monkeypatch.setattr(ports, "_handed_out", set())
    assert sorted(ports.free_port() for _ in range(3)) == [30990, 30991, 30992]
    with pytest.raises(RuntimeError, match="no free port"):
        ports.free_port()
