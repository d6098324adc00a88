#!/usr/bin/env python3
"""A non-blocking client that, while its connect is in progress, waits for
reading only (poll, epoll, select): rdmashim watches the connect internally
(to send the Hello), and the program must see exactly what the kernel says.
Run under rdmashim (its listener here is advertised, so the client announces
itself) and without; the same expectations hold.

  refused  the connect is refused (a SYN dropped at a full accept queue,
           then the listener closed): the wait wakes with the kernel's events,
           SO_ERROR still says ECONNREFUSED, and the announcement is gone
           once the wait returned.
  silent   the connect completes (about 1 s: a dropped SYN) but no byte
           comes: the wait returns nothing, at its own timeout, not before.

usage: connecting_wait.py   (exit 0: all as expected)"""
import errno, os, select, socket, sys, threading, time

shim = "rdmashim" in os.environ.get("LD_PRELOAD", "")
failures = []
lock = threading.Lock()


def check(what, ok):
    with lock:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)


def slow_connect():
    """A listener with a full accept queue and a non-blocking connect to it
    whose SYN was dropped (it retransmits after about 1 s)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    plug = socket.create_connection(ls.getsockname())
    c = socket.socket()
    c.setblocking(False)
    check("connect in progress", c.connect_ex(ls.getsockname()) == errno.EINPROGRESS)
    return ls, plug, c


def wait_in(call, s, timeout_s):
    """What the call reports for s asked for reading only: poll-style revents (0: nothing)."""
    if call == "poll":
        p = select.poll()
        p.register(s, select.POLLIN)
        r = p.poll(timeout_s * 1000)
        return r[0][1] if r else 0
    if call == "epoll":
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLIN)
        r = ep.poll(timeout_s)
        ep.close()
        return r[0][1] if r else 0
    return select.POLLIN if select.select([s], [], [], timeout_s)[0] else 0


def announced(s):
    name = "rdmashim/v1/client/%d" % os.fstat(s.fileno()).st_ino
    with open("/proc/net/unix") as f:
        return sum(name in line for line in f)


def scenarios(call):
    ls, plug, c = slow_connect()
    check("%s refused: announced while connecting" % call, announced(c) == (1 if shim else 0))
    time.sleep(0.05)
    ls.close()  # the SYN's retransmission meets no listener: RST
    t0 = time.monotonic()
    ev = wait_in(call, c, 5)
    took = time.monotonic() - t0
    want = select.POLLIN if call == "select" else select.POLLIN | select.POLLERR | select.POLLHUP
    check("%s refused: events %#x (want %#x) after %.2f s" % (call, ev, want, took), ev == want and took < 4)
    check("%s refused: announcement withdrawn" % call, announced(c) == 0)
    check("%s refused: SO_ERROR ECONNREFUSED" % call,
          c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED)
    for s in (c, plug):
        s.close()

    ls, plug, c = slow_connect()
    time.sleep(0.05)
    queued, _ = ls.accept()  # room for the retransmitted SYN: the connect completes
    t0 = time.monotonic()
    ev = wait_in(call, c, 1.3)
    took = time.monotonic() - t0
    check("%s silent: nothing reported (%#x) after %.2f s (timeout 1.3 s)" % (call, ev, took),
          ev == 0 and 1.29 <= took < 2.5)
    check("%s silent: the connect completed" % call, c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    for s in (c, plug, queued, ls):
        s.close()

# The three calls at once (each waits about 2.5 s, mostly for SYN retransmissions).
threads = [threading.Thread(target=scenarios, args=(call,)) for call in ("poll", "epoll", "select")]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.exit(1 if failures else 0)
