#!/usr/bin/env python3
"""A close while the peer's host is unreachable (tests/softroce/cross.sh, gone).

Both sides under rdmashim on verbs, in two guests. One byte each way and one
more from the client, so both directions are on the ring; the server then
answers "w" and takes its guest's link down, as if its host had crashed: no
reset, no FIN, nothing confirms an RDMA write any more. The client waits
until the link is surely down, writes BYTES (they fit the ring: the write
returns, as on TCP, where they would wait in the send buffer) and closes.
On TCP that close returns at once; rdmashim's must not wait the setup
timeout for confirmations that cannot come. The server brings the link back
after HOLD seconds and exits without reading.

Prints "close_ms=N" (client) or "down_ok=1" (server); the caller bounds close_ms.
usage: close_host_gone.py server PORT HOLD | client HOST PORT BYTES
"""
import socket
import subprocess
import sys
import time

role = sys.argv[1]
if role == "server":
    port, hold = int(sys.argv[2]), float(sys.argv[3])
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("0.0.0.0", port))
    lst.listen(1)
    conn, _ = lst.accept()
    conn.recv(1)
    conn.sendall(b"y")
    conn.recv(1)
    conn.sendall(b"w")
    down = subprocess.run(["ip", "link", "set", "eth0", "down"]).returncode == 0
    print("down_ok=%d" % down, flush=True)
    time.sleep(hold)
    subprocess.run(["ip", "link", "set", "eth0", "up"])
    conn.close()
else:
    host, port, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for _ in range(200):
        try:
            c = socket.create_connection((host, port))
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("no server")
    c.sendall(b"x")
    if c.recv(1) != b"y":
        sys.exit("no greeting")
    c.sendall(b"z")
    if c.recv(1) != b"w":
        sys.exit("no answer")
    time.sleep(1.5)  # the server's link is down by now
    c.sendall(bytes(i & 0xFF for i in range(size)))
    start = time.monotonic()
    c.close()
    print("close_ms=%d" % ((time.monotonic() - start) * 1000), flush=True)
