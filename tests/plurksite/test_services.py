"""plurksite.services: the helpers every test's services are started with."""
from plurksite import services


def test_free_ports_are_never_handed_out_twice_lately():
    # A probe's port is free again the moment it closes; CI once gave fastpath's --edge the port
    # of its --listen, and fastpath (rightly) refused to start.
    ports = [services.free_port() for _ in range(1500)] + services.free_ports(200)
    assert len(set(ports)) == len(ports)


def test_free_ports_skip_a_port_handed_out_before(monkeypatch):
    monkeypatch.setattr(services, "_handed", services.collections.OrderedDict())
    first = services.free_port()
    real_socket = services.socket.socket
    probes = []

    class Repeating(real_socket):                 # the kernel offers `first` once more
        def bind(self, address):
            probes.append(address)
            return super().bind((address[0], first if len(probes) == 1 else 0))

    monkeypatch.setattr(services.socket, "socket", Repeating)
    again = services.free_port()
    assert again != first and len(probes) == 2
