"""A userspace netem for kernels without it: pass every frame between two links, each one
``ms`` milliseconds after it arrived.

    python -m plurksite.cluster.delay MS LINK_A LINK_B

Both links are read and written through AF_PACKET sockets with a virtio-net header, so segments
the kernel has not yet cut (GSO) and checksums it has not yet computed pass through unchanged;
our own writes are not read back (PACKET_IGNORE_OUTGOING).  Prints ``ready`` once both sockets
are bound; runs until killed.  A frame that cannot be sent at once is dropped, as a full queue
would.  ``plurksite.cluster.netns.Network.delay`` starts and stops it.
"""
import heapq
import itertools
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
FRAME_MAX = 65536 + 64          # a GSO segment (64 KiB) with its Ethernet and virtio-net headers


def open_link(ifname):
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((ifname, 0))
    sock.setblocking(False)
    return sock


def relay(delay_s, link_a, link_b):
    by_fd = {link_a.fileno(): (link_a, link_b), link_b.fileno(): (link_b, link_a)}
    due = []                            # (time to send, sequence, socket, frame)
    order = itertools.count()
    poller = select.epoll()
    for sock in (link_a, link_b):
        poller.register(sock.fileno(), select.EPOLLIN)
    while True:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else -1
        for fd, _ in poller.poll(timeout):
            while True:
                try:
                    frame = by_fd[fd][0].recv(FRAME_MAX)
                except BlockingIOError:
                    break
                except OSError:         # ENETDOWN once a link went down (a partition): go on
                    break
                heapq.heappush(due, (time.monotonic() + delay_s, next(order), by_fd[fd][1], frame))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, frame = heapq.heappop(due)
            try:
                out.send(frame)
            except OSError:             # ENOBUFS, link down: lost, as on a wire
                pass


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python -m plurksite.cluster.delay MS LINK_A LINK_B", file=sys.stderr)
        return 2
    try:
        delay_s = int(argv[0]) / 1000.0
        links = [open_link(name) for name in argv[1:]]
    except (ValueError, OSError) as exc:
        print(f"delay relay: {exc}", file=sys.stderr)
        return 1
    print("ready", flush=True)
    relay(delay_s, *links)
    return 0


if __name__ == "__main__":
    sys.exit(main())
