#!/usr/bin/env python3
"""A server-speaks-first protocol (greeting, then request/response), like
SMTP, FTP, POP/IMAP, MySQL or an rsync daemon. Plain sockets: the same script
runs with or without rdmashim.

  speaks_first.py server --port-file F --count N
  speaks_first.py client --port P --count N [--mixed]

The server greets each connection, then answers one request line with a line
that names the request and its SHA-256. The client checks the greeting and
every answer byte for byte, and prints one JSON line with the median time
from connect() to the greeting's first byte (microseconds)."""
import argparse, hashlib, json, select, socket, statistics, sys, time

GREETING = b"220 speaks-first ready\r\n"


def read_line(s):
    buf = b""
    while not buf.endswith(b"\n"):
        b = s.recv(1)
        if not b:
            raise SystemExit("unexpected EOF after %r" % buf)
        buf += b
    return buf


def answer(req):
    return b"250 " + hashlib.sha256(req).hexdigest().encode() + b" " + req


def server(a):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(128)
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    import os
    os.rename(a.port_file + ".tmp", a.port_file)
    bad = 0
    for i in range(a.count):
        c, _ = ls.accept()
        c.sendall(GREETING)
        req = read_line(c)
        if req != b"REQ %d %s\n" % (i, b"x" * (i % 50)):
            bad += 1
        c.sendall(answer(req))
        c.close()
    print(json.dumps({"served": a.count, "bad_requests": bad}))
    return 1 if bad else 0


def client(a):
    lat, bad = [], 0
    for i in range(a.count):
        s = socket.socket()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        if a.mixed and i % 2:
            # An event-loop client, busy for a moment after connecting: its
            # Hello leaves at its next call (here select()), well after the
            # server accepted and wanted to greet.
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", a.port))
            time.sleep(0.003)
            select.select([s], [], [], 10)
            s.setblocking(True)
            first = s.recv(1)
        else:
            s.connect(("127.0.0.1", a.port))
            first = s.recv(1)
            lat.append((time.perf_counter() - t0) * 1e6)
        got = first + read_line(s) if first != b"\n" else first
        if got != GREETING:
            bad += 1
        req = b"REQ %d %s\n" % (i, b"x" * (i % 50))
        s.sendall(req)
        if read_line(s) != answer(req) or s.recv(1) != b"":
            bad += 1
        s.close()
    print(json.dumps({"connections": a.count, "bad": bad, "median_greeting_us": round(statistics.median(lat), 1)}))
    return 1 if bad else 0


p = argparse.ArgumentParser()
p.add_argument("mode", choices=["server", "client"])
p.add_argument("--port-file")
p.add_argument("--port", type=int)
p.add_argument("--count", type=int, default=100)
p.add_argument("--mixed", action="store_true", help="every other connection non-blocking and busy for 3 ms")
a = p.parse_args()
sys.exit(server(a) if a.mode == "server" else client(a))
