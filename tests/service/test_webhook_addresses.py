"""A job webhook whose URL is an IPv6 literal that carries an IPv4 address is judged by that IPv4
address (security.md, "Job webhooks"), with a real ztraind allowing every host
(--webhook-allow '*', no --webhook-allow-private).

The IPv6 forms are built with Python's ipaddress module, and whether each must be refused is
decided by security.md's list of ranges, written here with ipaddress networks: an IPv4 address
in one of them, carried as IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64's
well-known prefix (64:ff9b::a.b.c.d, RFC 6052), 6to4 (2002:AABB:CCDD::, RFC 3056) or a Teredo
client (2001:0::/32, the address inverted, RFC 4380; Python's .teredo reads it back), is refused
at submit naming the IPv6 literal; a public one (8.8.8.8, 1.1.1.1) in the same forms is taken.
NAT64's local-use prefix 64:ff9b:1::/48 (RFC 8215) says nothing of where it leads: refused.
On main, 64:ff9b::7f00:1, ::a9fe:a9fe, 2002:7f00:1:: and the Teredo forms were all taken."""
import ipaddress
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svc import BUILD, Checker, Daemon, stubs, submit, temp_dir, tiny_job  # noqa: E402

import grpc  # noqa: E402

pb = stubs()[0]
ck = Checker()

# security.md: loopback, private, link-local, CGNAT, unspecified, multicast and broadcast.
REFUSED_V4 = [ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4")]


def refused_v4(v4):
    return any(v4 in n for n in REFUSED_V4)


def forms(v4):
    """The IPv6 addresses that carry v4, each checked to read back as v4 where ipaddress can."""
    n = int(v4)
    mapped = ipaddress.IPv6Address((0xffff << 32) | n)
    compat = ipaddress.IPv6Address(n)
    nat64 = ipaddress.IPv6Address((0x64ff9b << 96) | n)
    six2four = ipaddress.IPv6Address((0x2002 << 112) | (n << 80))
    teredo = ipaddress.IPv6Address((0x20010000 << 96) | (int(ipaddress.IPv4Address("192.0.2.1"))
                                                         << 64) | (n ^ 0xffffffff))
    assert mapped.ipv4_mapped == v4 and six2four.sixtofour == v4 and teredo.teredo[1] == v4
    return {"IPv4-mapped": mapped, "IPv4-compatible": compat, "NAT64": nat64,
            "6to4": six2four, "Teredo": teredo}


def attempt(d, base, addr):
    job = dict(base, alerts={"webhooks": [{"url": f"http://[{addr}]:8080/hook", "on": ["end"]}]})
    try:
        j = submit(d, job)
        d.stub().CancelJob(pb.CancelJobRequest(id=j.id), metadata=d.metadata, timeout=10)
        return "taken"
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"


with Daemon(BUILD, temp_dir("ztrain-hook-addr-"), max_ranks=1,
            extra_args=["--webhook-allow", "*", "--max-jobs", "1000"]) as d:
    base = tiny_job(d.data_root, max_steps=1)
    for text in ("127.0.0.1", "169.254.169.254", "10.1.2.3", "192.168.0.1", "100.64.0.1",
                 "8.8.8.8", "1.1.1.1"):
        v4 = ipaddress.IPv4Address(text)
        for form, addr in forms(v4).items():
            if form == "IPv4-compatible" and int(v4) <= 1:
                continue   # :: and ::1 are IPv6's own
            r = attempt(d, base, addr)
            if refused_v4(v4):
                ck.check(r.startswith("INVALID_ARGUMENT") and str(addr) in r and "private" in r,
                         f"{text} as {form} {addr} is refused: {r}")
            else:
                ck.check(r == "taken", f"public {text} as {form} {addr} is taken: {r}")
    for addr in ("64:ff9b:1::a00:1", "64:ff9b:1:7f00:1::"):
        r = attempt(d, base, addr)
        ck.check(r.startswith("INVALID_ARGUMENT") and "private" in r,
                 f"NAT64 local-use {addr} is refused: {r}")
ck.done()
