#!/usr/bin/env python3
"""A close after the peer exited (tests/softroce/guest/faults.sh, on verbs).

One byte each way, then one more from the client, so both sides are on the
ring, and the client shuts down writing (all its data confirmed, as in
softroce.faults' `none`). The server then writes BYTES (less than the ring:
no credit needed), closes and exits, which destroys its QP. The client
meanwhile sleeps, then reads everything to EOF, which returns credits (WRITE
WITH IMM) to the QP that is gone, and closes. Its close must not wait for
them: none of its data is in flight (rxe retries them forever). Prints "close_ms=N received=N"; the caller
bounds close_ms.

usage: close_peer_gone.py server PORTFILE BYTES HOST | client PORT BYTES HOST
"""
import os
import socket
import sys
import time

role = sys.argv[1]
if role == "server":
    port_file, size = sys.argv[2], int(sys.argv[3])
    lst = socket.socket()
    lst.bind((sys.argv[4], 0))
    lst.listen(1)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(lst.getsockname()[1]))
    os.rename(port_file + ".tmp", port_file)
    conn, _ = lst.accept()
    conn.recv(1)
    conn.sendall(b"y")
    conn.recv(1)  # the client attached its QP when it read our Ack with "y"
    conn.sendall(bytes(i & 0xFF for i in range(size)))
    conn.close()
else:
    port, size, host = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    c = socket.create_connection((host, port))
    c.sendall(b"x")
    if c.recv(1) != b"y":
        sys.exit("no greeting")
    c.sendall(b"z")
    c.shutdown(socket.SHUT_WR)  # its flush: "z" confirmed while the server is alive
    time.sleep(3)  # the server writes, closes and exits meanwhile
    got = 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += len(b)
    start = time.monotonic()
    c.close()
    print("close_ms=%d received=%d" % ((time.monotonic() - start) * 1000, got))
