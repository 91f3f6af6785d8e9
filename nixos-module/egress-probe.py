#!/usr/bin/env python3
"""Whether a unit's egress rules hold: the twin (twin.sh) and the VM test (test.nix) run this
inside the network namespace of the system under test, to show that what a unit's
IPAddressDeny= and SocketBindDeny= forbid is refused to every process of that unit.

    egress-probe.py CGROUP_DIR

It listens on 127.0.0.1 (a TCP port and a UDP port the kernel picks), tries both from here (the
control: both must work), then forks a child that moves itself into CGROUP_DIR (the unit's own
cgroup, where systemd attached the unit's BPF programs) and tries again: a datagram to the UDP
port, a connection to the TCP port (one SYN retry, TCP_SYNCNT, so a dropped SYN ends in
seconds), and binding a TCP socket. It prints one JSON object:

    {"control": {"udp": "ok", "tcp": "ok"}, "unit": {"udp": ..., "tcp": ..., "bind": ...}}

each value "ok" or the errno's name. The outcome does not depend on timing: a connection whose
packets a unit's IPAddressDeny= drops never completes, however long it is given.
"""

import errno
import json
import os
import socket
import sys


def outcome(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def tries(udp_port, tcp_port, bind_too):
    def udp():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"egress probe", ("127.0.0.1", udp_port))

    def tcp():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT, 1)
            s.connect(("127.0.0.1", tcp_port))

    def bind():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))

    got = {"udp": outcome(udp), "tcp": outcome(tcp)}
    if bind_too:
        got["bind"] = outcome(bind)
    return got


def main():
    cgroup = sys.argv[1]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    tcp_port = listener.getsockname()[1]
    udp_port = receiver.getsockname()[1]

    control = tries(udp_port, tcp_port, False)

    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            got = tries(udp_port, tcp_port, True)
        except OSError as e:
            got = {"join": errno.errorcode.get(e.errno, str(e.errno))}
        os.write(write, json.dumps(got).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while True:
        b = os.read(read, 4096)
        if not b:
            break
        chunks.append(b)
    os.waitpid(child, 0)
    unit = json.loads(b"".join(chunks) or b"{}")
    print(json.dumps({"control": control, "unit": unit}, sort_keys=True))


if __name__ == "__main__":
    main()
