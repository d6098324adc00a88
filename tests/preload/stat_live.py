#!/usr/bin/env python3
"""Peers for stat_live.sh: connections that stay open while `rdmashim stat`
looks at them, each recording what it sent and received and in how many calls.

  stat_live.py server PORTFILE OUTFILE       serves until killed
  stat_live.py client PORT SIZE EXTRA OUTFILE READYFILE   one connection, held until stdin closes
  stat_live.py plainmany PORT N READYFILE    N connections sending one byte each, held until stdin closes

Protocol: the client sends a 4-byte length L, then L bytes; the server reads
them and answers 2L+1 bytes; the client reads those, then sends EXTRA bytes
the server never reads. OUTFILE gets one JSON line per connection:
local, peer, bytes and calls each way, as the program saw them.
"""
import json
import socket
import struct
import sys
import threading


def recv_exact(s, n, calls):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise SystemExit("peer closed early")
        calls[0] += 1
        data += chunk
    return data


def send_one(s, data, calls):
    sent = s.send(data)  # small messages: one call, or the test is wrong
    if sent != len(data):
        raise SystemExit("short send %d of %d" % (sent, len(data)))
    calls[0] += 1


def fmt(addr):
    return "%s:%d" % addr[:2] if ":" not in addr[0] else "[%s]:%d" % addr[:2]


def serve_one(conn, out, lock):
    rx_calls, tx_calls = [0], [0]
    first = conn.recv(1)  # a plain client's one byte, or the first of a length
    if not first:
        return
    rx_calls[0] += 1
    if first == b"!":  # plainmany: hold, never answer
        conn.recv(1)
        return
    head = first + recv_exact(conn, 3, rx_calls)
    (size,) = struct.unpack("!I", head)
    recv_exact(conn, size, rx_calls)
    send_one(conn, b"s" * (2 * size + 1), tx_calls)
    with lock:
        out.write(json.dumps({"local": fmt(conn.getsockname()), "peer": fmt(conn.getpeername()),
                              "rx_bytes": 4 + size, "rx_msgs": rx_calls[0],
                              "tx_bytes": 2 * size + 1, "tx_msgs": tx_calls[0]}) + "\n")
        out.flush()
    threading.Event().wait()  # holds the connection; the EXTRA bytes stay unread


def main():
    role = sys.argv[1]
    if role == "server":
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(512)
        out, lock = open(sys.argv[3], "w"), threading.Lock()
        with open(sys.argv[2] + ".tmp", "w") as f:
            f.write(str(ls.getsockname()[1]))
        import os
        os.rename(sys.argv[2] + ".tmp", sys.argv[2])
        while True:
            conn, _ = ls.accept()
            threading.Thread(target=serve_one, args=(conn, out, lock), daemon=True).start()
    elif role == "client":
        port, size, extra = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        s = socket.create_connection(("127.0.0.1", port))
        rx_calls, tx_calls = [0], [0]
        send_one(s, struct.pack("!I", size), tx_calls)
        send_one(s, b"c" * size, tx_calls)
        recv_exact(s, 2 * size + 1, rx_calls)
        if extra:
            send_one(s, b"x" * extra, tx_calls)
        with open(sys.argv[5], "w") as f:
            f.write(json.dumps({"local": fmt(s.getsockname()), "peer": fmt(s.getpeername()),
                                "tx_bytes": 4 + size + extra, "tx_msgs": tx_calls[0],
                                "rx_bytes": 2 * size + 1, "rx_msgs": rx_calls[0], "extra": extra}) + "\n")
        open(sys.argv[6], "w").close()
        sys.stdin.read()
    elif role == "plainmany":
        port, n = int(sys.argv[2]), int(sys.argv[3])
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.send(b"!")
            socks.append(s)
        open(sys.argv[4], "w").close()
        sys.stdin.read()


main()
