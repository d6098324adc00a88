#!/usr/bin/env python3
"""Fork and exec with an upgraded stream (tests/softroce/forking.sh across two
guests on verbs, tests/preload/fork_handover.sh on one host).

The stream carries five parts, each a seeded pattern, each hashed (SHA-256)
by its sender and by whoever received it:
  A  client -> server  1 MiB + 7   the server reads it all (the upgrade: both ways on the ring)
  B  server -> client  256 KiB + 3
  C  client -> server  300 KiB + 11  sent right after B was read; the server
                                   leaves it UNREAD in its ring, then forks or execs
  D  server -> client  2 MiB + 5   from the child (or the new program); the client
                                   sleeps in recv() for it meanwhile
  E  client -> server  100 KiB + 1, then FIN; read by the child to EOF
Scenarios (server side):
  fork    fork; the child reads C, sends D, reads E; the parent closes its copy
  shared  fork; the parent reads the first half of C, hands it to the child
          through a pipe (for the hash only), the child reads the rest, then as fork
  exec    the socket made inheritable, exec of this script, which goes on as the child
Every process prints "stream NAME sent|recv LEN SHA256 pid=PID"; `check CLIENT_OUT
SERVER_OUT` pairs them (each part sent once, received once, equal) and exits 0 if all are.

usage: fork_peer.py server --port P --scenario fork|shared|exec [--bind ADDR]
       fork_peer.py client --host H --port P [--connect-wait S] [--wait recv|poll]
         (--wait poll: the client sleeps in poll() rather than in recv())
       fork_peer.py check CLIENT_OUT SERVER_OUT
"""
import argparse
import hashlib
import os
import random
import select
import socket
import sys
import time

SIZES = {"A": (1 << 20) + 7, "B": (256 << 10) + 3, "C": (300 << 10) + 11, "D": (2 << 20) + 5, "E": (100 << 10) + 1}


def part(name):
    return random.Random("rdmashim-fork-" + name).randbytes(SIZES[name])


def say(name, direction, data):
    print(f"stream {name} {direction} {len(data)} {hashlib.sha256(data).hexdigest()} pid={os.getpid()}", flush=True)


WAIT = "recv"  # client --wait poll: sleep in poll() before each recv() instead


def recv_exact(s, n):
    out = bytearray()
    p = None
    if WAIT == "poll":
        p = select.poll()
        p.register(s.fileno(), select.POLLIN)
    while len(out) < n:
        if p:
            p.poll()
        b = s.recv(min(n - len(out), 1 << 20))
        if not b:
            break
        out += b
    return bytes(out)


def recv_eof(s):
    out = bytearray()
    while True:
        b = s.recv(1 << 20)
        if not b:
            return bytes(out)
        out += b


def send(s, name):
    data = part(name)
    s.sendall(data)
    say(name, "sent", data)


def serve_rest(s, prefix=b""):
    """The child's (or the new program's) part: the rest of C, D, then E to EOF."""
    c = prefix + recv_exact(s, SIZES["C"] - len(prefix))
    say("C", "recv", c)
    send(s, "D")
    say("E", "recv", recv_eof(s))
    s.close()


def server(a):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.bind, a.port))
    ls.listen(1)
    s, _ = ls.accept()
    ls.close()
    say("A", "recv", recv_exact(s, SIZES["A"]))
    send(s, "B")
    time.sleep(0.5)  # C arrives meanwhile and stays unread in our ring
    if a.scenario == "exec":
        fd = s.detach()
        os.set_inheritable(fd, True)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "rest", "--fd", str(fd)])
    if a.scenario == "fork":
        pid = os.fork()
        if pid == 0:
            serve_rest(s)
            os._exit(0)
        s.close()
    else:  # shared
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            with os.fdopen(r, "rb") as pipe:
                prefix = pipe.read()
            serve_rest(s, prefix)
            os._exit(0)
        os.close(r)
        half = recv_exact(s, SIZES["C"] // 2)
        print(f"parent read {len(half)} bytes of C pid={os.getpid()}", flush=True)
        with os.fdopen(w, "wb") as pipe:
            pipe.write(half)
        s.close()
    _, st = os.waitpid(pid, 0)
    print(f"child exit {os.waitstatus_to_exitcode(st)}", flush=True)


def rest(a):
    s = socket.socket(fileno=a.fd)
    serve_rest(s)
    print("child exit 0", flush=True)


def client(a):
    global WAIT
    WAIT = a.wait
    give_up = time.time() + a.connect_wait
    while True:
        try:
            s = socket.create_connection((a.host, a.port))
            break
        except OSError:
            if time.time() > give_up:
                raise
            time.sleep(0.2)
    send(s, "A")
    say("B", "recv", recv_exact(s, SIZES["B"]))
    send(s, "C")
    say("D", "recv", recv_exact(s, SIZES["D"]))  # asleep here while the server forks or execs
    send(s, "E")
    s.shutdown(socket.SHUT_WR)
    extra = recv_eof(s)
    print(f"after E: {len(extra)} more bytes, then EOF", flush=True)


def check(a):
    want = {n: hashlib.sha256(part(n)).hexdigest() for n in SIZES}
    seen = {}
    for path in (a.client_out, a.server_out):
        with open(path) as f:
            for line in f:
                w = line.split()
                if len(w) >= 5 and w[0] == "stream":
                    seen.setdefault((w[1], w[2]), []).append((int(w[3]), w[4]))
    ok = True
    for n, size in SIZES.items():
        sent, recv = seen.get((n, "sent"), []), seen.get((n, "recv"), [])
        good = len(sent) == 1 and len(recv) == 1 and sent[0] == recv[0] == (size, want[n])
        ok = ok and good
        print(f"{'ok' if good else 'FAIL'}: part {n} ({size} bytes): sent {sent or 'never'}, received {recv or 'never'}")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("server")
    sp.add_argument("--port", type=int, required=True)
    sp.add_argument("--bind", default="0.0.0.0")
    sp.add_argument("--scenario", choices=["fork", "shared", "exec"], required=True)
    rp = sub.add_parser("rest")
    rp.add_argument("--fd", type=int, required=True)
    cp = sub.add_parser("client")
    cp.add_argument("--host", required=True)
    cp.add_argument("--port", type=int, required=True)
    cp.add_argument("--connect-wait", type=float, default=30)
    cp.add_argument("--wait", choices=["recv", "poll"], default="recv")
    kp = sub.add_parser("check")
    kp.add_argument("client_out")
    kp.add_argument("server_out")
    a = p.parse_args()
    return {"server": server, "rest": rest, "client": client, "check": check}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
