"""The loopback ports bench and the tests start their stacks on: once each, never one in use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from commands.ports import DEFAULT_EPHEMERAL_LOW, PortRange, Ports, bindable, ephemeral_low, free_port


def test_no_port_is_handed_out_twice_in_one_process() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(port < ephemeral_low() for port in ports)  # no outgoing connection is given one


def test_ports_come_in_turn_from_the_start_and_wrap_around() -> None:
    ports = PortRange(20000, 20003, start=20002, free=lambda host, port: True)
    assert [ports.take() for _ in range(3)] == [20002, 20000, 20001]


def test_a_port_something_holds_is_skipped() -> None:
    ports = PortRange(20000, 20003, start=20000, free=lambda host, port: port != 20001)
    assert [ports.take(), ports.take()] == [20000, 20002]


def test_a_spent_range_says_so() -> None:
    ports = PortRange(20000, 20002, start=20000, free=lambda host, port: port == 20000)
    assert ports.take() == 20000
    with pytest.raises(RuntimeError, match="no free port left between 20000 and 20001"):
        ports.take()


def test_a_listening_socket_makes_its_port_unbindable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert not bindable("127.0.0.1", port)
    assert bindable("127.0.0.1", port)


def test_an_unreadable_ephemeral_range_falls_back_to_the_linux_default(tmp_path: Path) -> None:
    assert ephemeral_low(tmp_path / "missing") == DEFAULT_EPHEMERAL_LOW
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_low(tmp_path / "range") == 40000


def test_processes_side_by_side_take_ports_from_slices_that_never_meet() -> None:
    taken = []
    for index in range(3):
        ports = Ports()
        ports.share(index, 3)
        taken.append({ports.take() for _ in range(50)})
    assert not (taken[0] & taken[1] or taken[1] & taken[2] or taken[0] & taken[2])
    with pytest.raises(ValueError, match="slice 3 of 3 does not exist"):
        Ports().share(3, 3)
