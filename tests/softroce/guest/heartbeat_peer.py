#!/usr/bin/env python3
"""An idle verbs connection, then its peer killed (guest/local_verbs.sh).

Both run with RDMASHIM_HEARTBEAT_S=1. The server accepts one connection and
exchanges a byte each way twice (both directions on the ring), writes
MARK, and holds the connection without reading for HOLD seconds (the
caller kills it sooner). The
client exchanges the same bytes and sleeps until it is killed. An idle link
re-sends its last credit every second; to a peer gone without a Bye (its QP
destroyed, so rxe retries the beat and never completes it) it must post one
beat, not one a second.

usage: heartbeat_peer.py server PORTFILE MARK HOLD HOST | client PORT HOST PIDFILE
"""
import os
import socket
import sys
import time

role = sys.argv[1]
if role == "server":
    port_file, mark, hold, host = sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    lst = socket.socket()
    lst.bind((host, 0))
    lst.listen(1)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(lst.getsockname()[1]))
    os.rename(port_file + ".tmp", port_file)
    conn, _ = lst.accept()
    for _ in range(2):
        if conn.recv(1) != b"x":
            sys.exit("server: no request")
        conn.sendall(b"y")
    open(mark, "w").close()
    time.sleep(hold)
    conn.close()
else:
    port, host, pid_file = int(sys.argv[2]), sys.argv[3], sys.argv[4]
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))  # the caller kills this process itself, not its `timeout`
    c = socket.create_connection((host, port))
    for _ in range(2):
        c.sendall(b"x")
        if c.recv(1) != b"y":
            sys.exit("client: no answer")
    time.sleep(3600)
