#!/usr/bin/env python3
"""An event-loop server that speaks first (non-blocking sockets, one thread),
and clients that announce a Hello they never send. Plain sockets: the same
script runs with or without rdmashim.

  greeting_hold.py server --port-file F --count N --wait epoll|epoll-et|poll|select
  greeting_hold.py lazy --port P --sleep S     connects (non-blocking), then
                                               touches nothing for S seconds
  greeting_hold.py clients --port P --count N  one connection after another

The protocol is speaks_first.py's: a greeting, one request line, its answer
(the line's SHA-256), close. The server writes each greeting as soon as it
accepts, and on EAGAIN waits for the socket to turn writable in its loop. It
prints one JSON line: how many greetings met EAGAIN, and for each connection
the milliseconds from accept to its greeting's write. `lazy` and `clients`
check every byte and print JSON with the connect-to-greeting times."""
import argparse, json, os, select, socket, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speaks_first import GREETING, answer, read_line  # noqa: E402

IN, OUT, ET = select.EPOLLIN, select.EPOLLOUT, select.EPOLLET


class Loop:
    """epoll (level or edge), poll or select behind one interface."""

    def __init__(self, how):
        self.how = how
        self.want = {}
        if how.startswith("epoll"):
            self.ep = select.epoll()
        elif how == "poll":
            self.p = select.poll()

    def set(self, fd, events, new=False):
        self.want[fd] = events
        if self.how == "epoll-et":
            # Registered once for both directions, as nginx does.
            if new:
                self.ep.register(fd, IN | OUT | ET)
        elif self.how == "epoll":
            (self.ep.register if new else self.ep.modify)(fd, events)
        elif self.how == "poll":
            self.p.register(fd, events)  # registers or modifies

    def drop(self, fd):
        del self.want[fd]
        if self.how.startswith("epoll"):
            self.ep.unregister(fd)
        elif self.how == "poll":
            self.p.unregister(fd)

    def wait(self):
        if self.how.startswith("epoll"):
            return self.ep.poll(10)
        if self.how == "poll":
            return self.p.poll(10000)
        r, w, _ = select.select([f for f, e in self.want.items() if e & IN],
                                [f for f, e in self.want.items() if e & OUT], [], 10)
        return [(f, IN) for f in r] + [(f, OUT) for f in w]


def server(a):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    ls.setblocking(False)
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(a.port_file + ".tmp", a.port_file)
    loop = Loop(a.wait)
    loop.set(ls.fileno(), IN, new=True)
    conns = {}  # fd -> [socket, accepted at, greeted (ms) or None, buffered request]
    served, held, bad, greet_ms = 0, 0, 0, []

    def greet(fd):
        nonlocal held
        c = conns[fd]
        try:
            n = c[0].send(GREETING)
        except BlockingIOError:
            held += 1
            loop.set(fd, OUT)
            return
        assert n == len(GREETING), "a short greeting write"
        c[2] = (time.monotonic() - c[1]) * 1000
        greet_ms.append(round(c[2], 1))
        loop.set(fd, IN)

    while served < a.count:
        events = loop.wait()
        if not events:
            raise SystemExit("server: nothing happened for 10 s with %d of %d served" % (served, a.count))
        for fd, ev in events:
            if fd == ls.fileno():
                while True:
                    try:
                        c, _ = ls.accept()
                    except BlockingIOError:
                        break
                    c.setblocking(False)
                    conns[c.fileno()] = [c, time.monotonic(), None, b""]
                    loop.set(c.fileno(), 0, new=True)
                    greet(c.fileno())
                continue
            c = conns.get(fd)
            if c is None:
                continue
            if c[2] is None:
                if ev & (OUT | select.EPOLLERR | select.EPOLLHUP):
                    greet(fd)
                continue
            if not ev & (IN | select.EPOLLHUP | select.EPOLLERR):
                continue
            while not c[3].endswith(b"\n"):
                try:
                    b = c[0].recv(4096)
                except BlockingIOError:
                    break
                if not b:
                    bad += 1
                    c[3] += b"\n"
                    break
                c[3] += b
            if c[3].endswith(b"\n"):
                c[0].setblocking(True)
                c[0].sendall(answer(c[3]))
                loop.drop(fd)
                c[0].close()
                del conns[fd]
                served += 1
    print(json.dumps({"served": served, "greetings_held": held, "bad_requests": bad, "greeting_ms": greet_ms}))
    return 1 if bad else 0


def exchange(s, i):
    """The greeting, one request, its answer, EOF; returns the errors."""
    bad = read_line(s) != GREETING
    req = b"REQ %d %s\n" % (i, b"x" * (i % 50))
    s.sendall(req)
    bad += read_line(s) != answer(req) or s.recv(1) != b""
    s.close()
    return int(bad)


def lazy(a):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", a.port))
    time.sleep(a.sleep)  # a client that announced its Hello and then does nothing
    s.setblocking(True)
    t0 = time.monotonic()
    bad = exchange(s, 0)
    print(json.dumps({"bad": bad, "greeting_after_wake_ms": round((time.monotonic() - t0) * 1000, 1)}))
    return 1 if bad else 0


def clients(a):
    lat, bad = [], 0
    for i in range(a.count):
        s = socket.socket()
        t0 = time.monotonic()
        s.connect(("127.0.0.1", a.port))
        first = s.recv(1, socket.MSG_PEEK)
        lat.append((time.monotonic() - t0) * 1000)
        bad += not first or exchange(s, i)
    print(json.dumps({"bad": bad, "max_greeting_ms": round(max(lat), 1),
                      "median_greeting_ms": round(sorted(lat)[len(lat) // 2], 2)}))
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "lazy", "clients"])
    p.add_argument("--port-file")
    p.add_argument("--port", type=int)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--wait", default="epoll", choices=["epoll", "epoll-et", "poll", "select"])
    p.add_argument("--sleep", type=float, default=3)
    a = p.parse_args()
    return {"server": server, "lazy": lazy, "clients": clients}[a.role](a)


if __name__ == "__main__":
    sys.exit(main())
