#!/usr/bin/env python3
"""A server-speaks-first protocol (greeting, then request/response), like
SMTP, FTP, POP/IMAP, MySQL or an rsync daemon. Plain sockets: the same script
runs with or without rdmashim.

  speaks_first.py server --port-file F --count N [--bind ADDR] [--port P] [--extra 1] [--fork]
  speaks_first.py client --port P --count N [--mixed] [--host ADDR] [--connect-wait S]
                         [--compare-port Q]

The server greets each connection, then answers one request line with a line
that names the request and its SHA-256. The client checks the greeting and
every answer byte for byte, and prints one JSON line with the median time
from connect() to the greeting's first byte (microseconds)."""
import argparse, hashlib, json, os, select, socket, statistics, sys, time

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
    ls.bind((a.bind, a.port or 0))
    ls.listen(128)
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write(str(ls.getsockname()[1]))
        os.rename(a.port_file + ".tmp", a.port_file)
    bad = 0
    for i in range(-a.extra, a.count):
        c, _ = ls.accept()
        if a.fork:
            # Like an rsync daemon: a child per connection greets and serves.
            pid = os.fork()
            if pid:
                c.close()
                _, st = os.waitpid(pid, 0)
                bad += st != 0
                continue
            ls.close()
        c.sendall(GREETING)
        req = read_line(c)
        wrong = i >= 0 and req != b"REQ %d %s\n" % (i, b"x" * (i % 50))
        c.sendall(answer(req))
        c.close()
        if a.fork:
            os._exit(1 if wrong else 0)
        bad += wrong
    print(json.dumps({"served": a.count, "bad_requests": bad}))
    return 1 if bad else 0


def wait_for_server(a, port):
    """Until the server listens (another host's, started at about the same time)."""
    deadline = time.monotonic() + a.connect_wait
    while True:
        s = socket.socket()
        try:
            s.connect((a.host, port))
            return s
        except (ConnectionRefusedError, OSError):
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def one(a, port, i, lat):
    """Connection i to port; its connect-to-greeting time goes to lat. Returns the errors."""
    bad = 0
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    if a.mixed and i % 2:
        # An event-loop client, busy for a moment after connecting: its
        # Hello leaves at its next call (here select()), well after the
        # server accepted and wanted to greet.
        s.setblocking(False)
        s.connect_ex((a.host, port))
        if a.mixed_connected:
            # As most event loops do: first learn that the connect completed.
            select.select([], [s], [], 10)
        time.sleep(0.003)
        select.select([s], [], [], 10)
        s.setblocking(True)
        first = s.recv(1)
    else:
        s.connect((a.host, port))
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
    return bad


def client(a):
    lat, other, bad = [], [], 0
    ports = [a.port] + ([a.compare_port] if a.compare_port else [])
    for port in ports if a.connect_wait else []:
        # A connection of its own, not counted (the server's --extra 1).
        s = wait_for_server(a, port)
        if read_line(s) != GREETING:
            bad += 1
        s.sendall(b"REQ -1 \n")
        read_line(s)
        s.close()
    for i in range(a.count):
        if not a.compare_port:
            bad += one(a, a.port, i, lat)
            continue
        # Interleaved, in alternating order: both servers are measured under
        # the same conditions (a busy machine drifts).
        for port in (ports if i % 2 == 0 else ports[::-1]):
            bad += one(a, port, i, lat if port == a.port else other)
    out = {"connections": a.count, "bad": bad, "median_greeting_us": round(statistics.median(lat), 1)}
    if a.compare_port:
        out["compare_median_greeting_us"] = round(statistics.median(other), 1)
        out["median_difference_us"] = round(statistics.median(x - y for x, y in zip(lat, other)), 1)
    print(json.dumps(out))
    return 1 if bad else 0


p = argparse.ArgumentParser()
p.add_argument("mode", choices=["server", "client"])
p.add_argument("--port-file")
p.add_argument("--port", type=int)
p.add_argument("--bind", default="127.0.0.1")
p.add_argument("--fork", action="store_true", help="a child process per connection greets and serves it")
p.add_argument("--extra", type=int, default=0, help="connections served before the counted ones, unchecked")
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--compare-port", type=int, help="also connect to this server, interleaved, and compare the times")
p.add_argument("--connect-wait", type=float, default=0, help="first wait until the server listens (one extra connection)")
p.add_argument("--count", type=int, default=100)
p.add_argument("--mixed", action="store_true", help="every other connection non-blocking and busy for 3 ms")
p.add_argument("--mixed-connected", action="store_true",
               help="with --mixed: wait until the connect completed (writable) before the 3 ms")
a = p.parse_args()
sys.exit(server(a) if a.mode == "server" else client(a))
