#!/usr/bin/env python3
"""Many blocking threads, each on its own connection, whose links share a CQ
(softroce.verbs_local; core/verbs/shared_cq.h).

  shared_cq_peer.py server PORTFILE   a thread per connection echoes each
                                      message back until EOF
  shared_cq_peer.py client HOST PORT THREADS ROUNDS SEED
                                      THREADS threads, each with its own
                                      connection, send ROUNDS messages of
                                      seeded random sizes (1 B to 48 KiB) and
                                      read each echo back, with seeded random
                                      pauses between them; every byte is
                                      hashed on both ways

Run both under RDMASHIM_SPIN_US=0: every wait then sleeps, and the
completion that ends one thread's sleep is often polled by another thread
(or the CQ's watcher), which must ring the right doorbell. A lost wake-up
hangs a thread: the client gives up after its deadline and says which.
Prints {"threads": T, "rounds": R, "seed": S, "exact": bool, "secs": s,
"stuck": [thread ids], "slowest_ms": the longest round trip}; a failed run
replays with the same SEED. A wake-up lost but rescued by a timed wait
(maintenance, a writer's self-wake) shows as a slow round trip.
"""
import hashlib
import json
import os
import random
import socket
import sys
import threading
import time


def recv_exact(s, n):
    parts, got = [], 0
    while got < n:
        b = s.recv(min(n - got, 1 << 16))
        if not b:
            raise EOFError("EOF after %d of %d bytes" % (got, n))
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def serve(conn):
    with conn:
        while True:
            head = conn.recv(4)
            if not head:
                return
            if len(head) < 4:
                head += recv_exact(conn, 4 - len(head))
            n = int.from_bytes(head, "big")
            conn.sendall(recv_exact(conn, n))


def server(portfile):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", 0))
    ls.listen(64)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(portfile + ".tmp", portfile)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def client(host, port, threads, rounds, seed):
    done, bad, errors = set(), [], []
    slowest = [0.0] * threads  # each thread's longest round trip (s)

    def run(tid):
        rnd = random.Random(seed * 1000 + tid)
        try:
            with socket.create_connection((host, port), timeout=None) as s:
                for _ in range(rounds):
                    n = rnd.choice((1, 7, 64, 1000, 4096, rnd.randint(1, 48 << 10)))
                    msg = rnd.randbytes(n)
                    t = time.monotonic()
                    s.sendall(n.to_bytes(4, "big") + msg)
                    back = recv_exact(s, n)
                    slowest[tid] = max(slowest[tid], time.monotonic() - t)
                    if hashlib.sha256(back).digest() != hashlib.sha256(msg).digest():
                        bad.append(tid)
                        return
                    if rnd.random() < 0.2:
                        time.sleep(rnd.random() / 500)  # up to 2 ms: another thread's turn
            done.add(tid)
        except Exception as e:  # reported, never hidden
            errors.append("%d: %s" % (tid, e))

    t0 = time.monotonic()
    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    deadline = t0 + float(os.environ.get("SHARED_CQ_DEADLINE", "120"))
    for t in ts:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sorted(i for i in range(threads) if i not in done and not any(e.startswith("%d:" % i) for e in errors))
    out = {"threads": threads, "rounds": rounds, "seed": seed, "secs": round(time.monotonic() - t0, 2),
           "exact": len(done) == threads and not bad, "stuck": stuck,
           "slowest_ms": round(max(slowest) * 1000, 1), "mismatch": bad, "errors": errors[:4]}
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0 if out["exact"] else 1)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2])
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
