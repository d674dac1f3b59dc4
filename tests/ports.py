"""Free TCP ports on 127.0.0.1 for the tests that start servers or point at nothing: the ports
the kernel hands out for port 0, free when they are asked for (another program can still take
one before the test binds it)."""
import socket


def free_ports(n):
    """n different free ports: the sockets are held together while they are picked, so none
    repeats."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(span=1):
    """A port p with p .. p+span-1 all free right now (torchrun's agent takes p, ztrain's store
    p+1); one that nothing listens on, with the default span."""
    for _ in range(100):
        (p,) = free_ports(1)
        if p + span > 65536:
            continue
        ok = True
        for q in range(p + 1, p + span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
        if ok:
            return p
    raise RuntimeError(f"no {span} adjacent free ports on 127.0.0.1 in 100 tries")
