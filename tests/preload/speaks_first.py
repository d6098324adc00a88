#!/usr/bin/env python3
"""A server-speaks-first protocol (greeting, then request/response), like
SMTP, FTP, POP/IMAP, MySQL or an rsync daemon. Plain sockets: the same script
runs with or without rdmashim.

  speaks_first.py server --port-file F --count N [--bind ADDR] [--port P] [--extra 1] [--fork]
                         [--backlog B] [--accept-delay-ms D]
  speaks_first.py client --port P --count N [--mixed] [--host ADDR] [--connect-wait S]
                         [--compare-port Q] [--wait-in CALL] [--ttl N]

The server greets each connection, then answers one request line with a line
that names the request and its SHA-256. The client checks the greeting and
every answer byte for byte, and prints one JSON line with the median time
from connect() to the greeting's first byte (microseconds).

--ttl N: the client's own TTL, set before connect(); "ttl_changed" counts the
connections whose TTL differed after the greeting from before connect().

--wait-in CALL (with a server --backlog 0 --accept-delay-ms 50): every other
connection non-blocking, its connect slowed by a dropped SYN, and while it is
still connecting the client waits for the greeting only (readable, never
writable) with CALL: poll, ppoll, select, pselect, epoll (epoll_wait),
epoll_pwait2, as SMTP, MySQL or SSH clients do (see waiting_pair); or
epoll-nested (a set in the set waited on), poll-epoll (poll on the set),
poll-nofile (poll with RLIMIT_NOFILE at 1)."""
import argparse, ctypes, hashlib, json, os, resource, select, socket, statistics, sys, time

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
    ls.listen(a.backlog)
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write(str(ls.getsockname()[1]))
        os.rename(a.port_file + ".tmp", a.port_file)
    bad, greet_waits = 0, []
    for i in range(-a.extra, a.count):
        if a.accept_delay_ms:
            select.select([ls], [], [])  # one queued: with --backlog 0 the queue is full now
            time.sleep(a.accept_delay_ms / 1000)
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
        t0 = time.perf_counter()
        c.sendall(GREETING)
        greet_waits.append((time.perf_counter() - t0) * 1e6)
        req = read_line(c)
        wrong = i >= 0 and req != b"REQ %d %s\n" % (i, b"x" * (i % 50))
        c.sendall(answer(req))
        c.close()
        if a.fork:
            os._exit(1 if wrong else 0)
        bad += wrong
    out = {"served": a.count, "bad_requests": bad}
    if not a.fork:  # how long the greeting's write took (under rdmashim: the wait for a Hello)
        out["max_greeting_write_us"] = round(max(greet_waits), 1)
    print(json.dumps(out))
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


class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def wait_readable(s, call, timeout_s):
    """Waits until s is readable with the named call, asking for nothing else."""
    fd = s.fileno()
    if call == "poll":
        p = select.poll()
        p.register(fd, select.POLLIN)
        return bool(p.poll(timeout_s * 1000))
    if call == "select":
        return bool(select.select([s], [], [], timeout_s)[0])
    if call == "epoll":
        ep = select.epoll()
        try:
            ep.register(fd, select.EPOLLIN)
            return bool(ep.poll(timeout_s))
        finally:
            ep.close()
    # The calls Python lacks, through the C library (the preloaded one first).
    libc = ctypes.CDLL(None, use_errno=True)
    ts = timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    if call == "ppoll":
        pfd = (ctypes.c_int * 2)(fd, select.POLLIN)  # struct pollfd: int fd; short events, revents
        return libc.ppoll(pfd, 1, ctypes.byref(ts), None) > 0
    if call == "pselect":
        bits = (ctypes.c_ulong * 16)()  # fd_set
        bits[fd // 64] |= 1 << (fd % 64)
        return libc.pselect(fd + 1, bits, None, None, ctypes.byref(ts), None) > 0
    if call == "epoll_pwait2":
        ep = select.epoll()
        try:
            ep.register(fd, select.EPOLLIN)
            ev = (ctypes.c_uint8 * 12)()  # struct epoll_event (packed)
            n = libc.epoll_pwait2(ep.fileno(), ev, 1, ctypes.byref(ts), None)
            if n < 0 and ctypes.get_errno() == 38:  # ENOSYS: an older kernel
                return bool(ep.poll(timeout_s))
            return n > 0
        finally:
            ep.close()
    if call == "epoll-nested":  # the client in a set, that set in the one waited on
        inner, outer = select.epoll(), select.epoll()
        try:
            inner.register(fd, select.EPOLLIN)
            outer.register(inner.fileno(), select.EPOLLIN)
            return bool(outer.poll(timeout_s))
        finally:
            outer.close()
            inner.close()
    if call == "poll-epoll":  # the client in an epoll set, the set waited on with poll
        ep = select.epoll()
        try:
            ep.register(fd, select.EPOLLIN)
            p = select.poll()
            p.register(ep.fileno(), select.POLLIN)
            return bool(p.poll(timeout_s * 1000))
        finally:
            ep.close()
    if call == "poll-nofile":  # RLIMIT_NOFILE at 1 while it waits, as OpenSSH's sandbox sets
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (1, hard))
        try:
            p = select.poll()
            p.register(fd, select.POLLIN)
            return bool(p.poll(timeout_s * 1000))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    raise SystemExit("unknown --wait-in " + call)


def finish(s, i, first):
    """The rest of connection i after the greeting's first byte: the greeting,
    one request and its answer, then EOF. Returns the errors."""
    bad = 0
    got = first + read_line(s) if first != b"\n" else first
    if got != GREETING:
        bad += 1
    req = b"REQ %d %s\n" % (i, b"x" * (i % 50))
    s.sendall(req)
    if read_line(s) != answer(req) or s.recv(1) != b"":
        bad += 1
    s.close()
    return bad


TTL_CHANGED = [0]


def one(a, port, i, lat):
    """Connection i to port; its connect-to-greeting time goes to lat. Returns the errors."""
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if a.ttl:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, a.ttl)
    ttl = s.getsockopt(socket.IPPROTO_IP, socket.IP_TTL)
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
    # Whatever rdmashim marked its SYN with is gone once the greeting is here.
    TTL_CHANGED[0] += s.getsockopt(socket.IPPROTO_IP, socket.IP_TTL) != ttl
    return finish(s, i, first)


def waiting_pair(a, port, i, lat):
    """Connections i and i+1, for --wait-in. i connects (blocking) and sends
    its request at once: on a server with --backlog 0 and --accept-delay-ms it
    fills the accept queue, so the SYN of i+1 is dropped and its connect lasts
    one SYN retransmission (about 1 s; on one host a connect otherwise
    completes within the call). i+1 connects non-blocking and, while still
    connecting, waits for the greeting only (readable) with the call named.
    i+1's connect-to-greeting time goes to lat. Returns the errors."""
    sa = socket.create_connection((a.host, port))
    req = b"REQ %d %s\n" % (i, b"x" * (i % 50))
    sa.sendall(req)  # the server serves i while we wait on i+1
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    t0 = time.perf_counter()
    s.connect_ex((a.host, port))
    if not wait_readable(s, a.wait_in, 10):
        raise SystemExit("no greeting within 10 s")
    lat.append((time.perf_counter() - t0) * 1e6)
    s.setblocking(True)
    bad = finish(s, i + 1, s.recv(1))
    bad += read_line(sa) != GREETING
    bad += read_line(sa) != answer(req) or sa.recv(1) != b""
    sa.close()
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
    for i in range(0, a.count, 2) if a.wait_in else []:
        bad += waiting_pair(a, a.port, i, lat)
    for i in range(a.count) if not a.wait_in else []:
        if not a.compare_port:
            bad += one(a, a.port, i, lat)
            continue
        # Interleaved, in alternating order: both servers are measured under
        # the same conditions (a busy machine drifts).
        for port in (ports if i % 2 == 0 else ports[::-1]):
            bad += one(a, port, i, lat if port == a.port else other)
    out = {"connections": a.count, "bad": bad, "median_greeting_us": round(statistics.median(lat), 1),
           "max_greeting_us": round(max(lat), 1), "ttl_changed": TTL_CHANGED[0]}
    if a.compare_port:
        out["compare_median_greeting_us"] = round(statistics.median(other), 1)
        out["median_difference_us"] = round(statistics.median(x - y for x, y in zip(lat, other)), 1)
    print(json.dumps(out))
    return 1 if bad else 0



def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["server", "client"])
    p.add_argument("--port-file")
    p.add_argument("--port", type=int)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--fork", action="store_true", help="a child process per connection greets and serves it")
    p.add_argument("--backlog", type=int, default=128)
    p.add_argument("--accept-delay-ms", type=float, default=0, help="once a connection is queued, wait this long before accept()")
    p.add_argument("--extra", type=int, default=0, help="connections served before the counted ones, unchecked")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--compare-port", type=int, help="also connect to this server, interleaved, and compare the times")
    p.add_argument("--connect-wait", type=float, default=0, help="first wait until the server listens (one extra connection)")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--ttl", type=int, default=0, help="the client's own IP_TTL, set before connect()")
    p.add_argument("--mixed", action="store_true", help="every other connection non-blocking and busy for 3 ms")
    p.add_argument("--mixed-connected", action="store_true",
                   help="with --mixed: wait until the connect completed (writable) before the 3 ms")
    p.add_argument("--wait-in", choices=["poll", "ppoll", "select", "pselect", "epoll", "epoll_pwait2", "epoll-nested",
                                        "poll-epoll", "poll-nofile"],
                   help="non-blocking connects, waiting for the greeting (readable only) with this call")
    a = p.parse_args()
    return server(a) if a.mode == "server" else client(a)


if __name__ == "__main__":
    sys.exit(main())
