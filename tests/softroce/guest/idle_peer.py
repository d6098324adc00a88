#!/usr/bin/env python3
"""A connection that moves a lot, then goes idle (softroce.verbs_local).

  idle_peer.py server PORTFILE            accepts one client, reads its bytes
                                          (checked), answers 'k', then waits
                                          for the client's last byte
  idle_peer.py client HOST PORT BYTES IDLE_FILE SECS
                                          sends BYTES, reads 'k', touches
                                          IDLE_FILE, sits idle in select()
                                          until IDLE_FILE.done exists (at
                                          most SECS), then sends its last byte

Both sides sleep in rdmashim's hooks while idle (recv, select), where idle
connections give memory back. The server prints {"bytes": N, "exact": bool}.
"""
import os
import random
import select
import socket
import sys
import time

BLOCK = random.Random(7).randbytes(1 << 20)
TWICE = BLOCK + BLOCK


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b


def server(portfile):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((os.environ.get("PEERS_HOST", "127.0.0.1"), 0))
    ls.listen(1)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(portfile + ".tmp", portfile)
    c, _ = ls.accept()
    n = int.from_bytes(recv_exact(c, 8), "little")
    got, exact = 0, True
    while got < n:
        b = c.recv(min(1 << 20, n - got))
        if not b:
            break
        off = got % len(BLOCK)
        if TWICE[off:off + len(b)] != b:
            exact = False
        got += len(b)
    c.sendall(b"k")
    last = c.recv(1)
    print('{"bytes": %d, "exact": %s, "last": %s}' % (got, "true" if exact and got == n else "false",
                                                      "true" if last == b"x" else "false"), flush=True)


def client(host, port, n, idle_file, secs):
    s = socket.create_connection((host, int(port)))
    s.sendall(int(n).to_bytes(8, "little"))
    sent = 0
    while sent < n:
        k = min(len(BLOCK), n - sent)
        s.sendall(BLOCK[:k])
        sent += k
    if recv_exact(s, 1) != b"k":
        sys.exit(1)
    open(idle_file, "w").close()
    end = time.monotonic() + secs
    while not os.path.exists(idle_file + ".done") and time.monotonic() < end:
        select.select([s], [], [], 0.5)  # idle, asleep in our hooks
    s.sendall(b"x")
    s.close()


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], float(sys.argv[6]))
