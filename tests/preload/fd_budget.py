#!/usr/bin/env python3
"""Many concurrent connections under a descriptor limit (see fd_budget.sh).

server --port-file F --count N: accepts N connections (epoll, non-blocking),
  answers each "ping K\\n" with "pong K\\n", exits once all N closed. Prints
  JSON: accepted, answered, errors (accept/recv failures by errno name).
client --port P --count N: opens N connections, pinging each once as it
  opens and keeping all open, then pings each again, then closes them. JSON.
numbers --port-file F | --port P: one connection each side, then opens
  /dev/null and prints the descriptor numbers it got (socket, file); then
  closes every other descriptor (closerange, and close() up to 65535) and
  exchanges one more message on the connection.
"""
import argparse, errno, json, os, selectors, socket, sys, time


def server(args):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1024)
    ls.setblocking(False)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(args.port_file + ".tmp", args.port_file)
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    accepted = answered = closed = 0
    errors = {}
    bufs = {}
    while closed < args.count:
        for key, _ in sel.select(timeout=30):
            if key.data is None:
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue
                except OSError as e:
                    name = errno.errorcode.get(e.errno, str(e.errno))
                    errors[name] = errors.get(name, 0) + 1
                    if errors[name] > 1000:
                        raise
                    continue
                accepted += 1
                c.setblocking(False)
                bufs[c.fileno()] = b""
                sel.register(c, selectors.EVENT_READ, c)
                continue
            c = key.data
            try:
                data = c.recv(4096)
            except BlockingIOError:
                continue
            except OSError as e:
                name = errno.errorcode.get(e.errno, str(e.errno))
                errors[name] = errors.get(name, 0) + 1
                data = b""
            if not data:
                sel.unregister(c)
                bufs.pop(c.fileno(), None)
                c.close()
                closed += 1
                continue
            buf = bufs[c.fileno()] + data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                c.sendall(b"pong" + line[4:] + b"\n")
                answered += 1
            bufs[c.fileno()] = buf
    print(json.dumps({"accepted": accepted, "answered": answered, "errors": errors}))


def client(args):
    conns, errors = [], {}

    def ping(c, tag):
        try:
            msg = b"ping %s\n" % tag
            c.sendall(msg)
            want, got = b"pong" + msg[4:], b""
            while not got.endswith(b"\n"):
                part = c.recv(64)
                if not part:
                    break
                got += part
            return got == want
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            errors[name] = errors.get(name, 0) + 1
            return False

    good = 0
    for i in range(args.count):  # each one used at once (its handshake ends), and kept open
        try:
            conns.append(socket.create_connection(("127.0.0.1", args.port), timeout=20))
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            errors[name] = errors.get(name, 0) + 1
            continue
        # A client that fell back after a negative Ack sends its Plain frame
        # and then the ping: without this, Nagle holds the ping for the
        # server's delayed ACK (40 ms each; not what this test is about).
        conns[-1].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        good += ping(conns[-1], b"0.%d" % i)
    for i, c in enumerate(conns):  # all of them open meanwhile
        good += ping(c, b"1.%d" % i)
    for c in conns:
        c.close()
    print(json.dumps({"connected": len(conns), "good": good, "errors": errors}))


def numbers(args):
    server = bool(args.port_file)
    if server:
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(8)
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(ls.getsockname()[1]))
        os.rename(args.port_file + ".tmp", args.port_file)
        s, _ = ls.accept()
        s.sendall(b"hi\n")          # the handshake runs at the first I/O
        got = s.recv(16)
        ls.detach()
    else:
        s = socket.create_connection(("127.0.0.1", args.port), timeout=20)
        got = s.recv(16)
        s.sendall(b"ok\n")
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    # A daemon's "close every other descriptor": the connection must live on.
    os.closerange(3, s.fileno())
    os.closerange(s.fileno() + 1, 1 << 20)
    for fd in range(3, 1 << 16):
        if fd != s.fileno():
            try:
                os.close(fd)
            except OSError:
                pass
    idle = True
    if server:
        time.sleep(0.3)  # the client sleeps in recv meanwhile (on its doorbell)
        s.sendall(b"more\n")
        after = s.recv(16)
    else:
        cpu = time.process_time()
        after = s.recv(16)
        idle = time.process_time() - cpu < 0.1  # slept, did not spin
        s.sendall(b"done\n")
        s.recv(16)  # EOF: the server read our bytes
    print(json.dumps({"socket": s.fileno(), "files": fds, "got": got.decode(), "after": after.decode(),
                      "waited_idle": idle}))
    sys.stdout.flush()
    s.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["server", "client", "numbers"])
    p.add_argument("--port-file")
    p.add_argument("--port", type=int)
    p.add_argument("--count", type=int, default=900)
    a = p.parse_args()
    {"server": server, "client": client, "numbers": numbers}[a.mode](a)


if __name__ == "__main__":
    main()
