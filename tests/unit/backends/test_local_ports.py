"""The local backend's gang rendezvous port: below the kernel's ephemeral range (an outbound connection can take a
port there at any moment: EADDRINUSE when torchrun then listens, seen in CI), with the ports after it that the
preflight (P+1) and a gang with spares' generations (P+1+g) use free too."""

from __future__ import annotations

import socket

from stoker.backends.local.backend import _ephemeral_low, free_port


def test_the_port_and_the_ones_after_it_are_free_and_below_the_ephemeral_range():
    low = _ephemeral_low()
    for span in (2, 5):
        port = free_port(span)
        assert 1024 <= port and port + span <= low
        for p in range(port, port + span):
            with socket.socket() as s:
                s.bind(("", p))  # free: bindable on every address, as torchrun's store binds


def test_a_taken_port_is_never_given():
    held = []
    try:
        port = free_port(3)
        for p in range(port, port + 3):
            s = socket.socket()
            s.bind(("", p))
            s.listen()
            held.append(s)
        for _ in range(50):
            got = free_port(3)
            assert not set(range(got, got + 3)) & set(range(port, port + 3))
    finally:
        for s in held:
            s.close()
