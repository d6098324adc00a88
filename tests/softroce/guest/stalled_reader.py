#!/usr/bin/env python3
"""A reader that looks at nothing for a while, and a writer of small
messages on a non-blocking socket (tests/softroce/guest/local_verbs.sh).

  server PORTFILE SLEEP   accept; greet ("g"); read nothing (no call on the
                          socket at all) for SLEEP s; then read to EOF and
                          answer the SHA-256 of what came
  client PORT SECONDS     64 B messages, non-blocking, until SECONDS pass or
                          a send has had EAGAIN for 1 s; then waits in
                          select() until the socket is writable again (the
                          reader is back); then the end of the stream, and
                          the server's answer

On TCP the writer fills the socket buffers and gets EAGAIN. Over verbs each
message is one WRITE WITH IMM, which takes one of the reader's posted
receives; with the reader away they run out and the rest wait in our send
queue (Soft-RoCE retries them without limit). The writer must then get
EAGAIN as from a full buffer: before, its send() spun until the reader came
back. Prints {"sent", "longest_call_s", "eagain", "writable_after_s",
"sha256", "answer"}.
(The end of the stream waits for the reader: a shutdown() whose flush times
out while the reader is away lets the FIN overtake what still waits in the
send queue; docs/ARCHITECTURE.md, "Not done".)
"""
import hashlib, json, os, select, socket, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import HOST, accept_greeted  # staged beside us (tests/buffering/peers.py)


def server(portfile, sleep_s):
    conn = accept_greeted(portfile)
    time.sleep(sleep_s)
    h, n = hashlib.sha256(), 0
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        h.update(data)
        n += len(data)
    conn.sendall(("%d %s\n" % (n, h.hexdigest())).encode())
    conn.close()


def client(port, seconds):
    s = socket.create_connection((HOST, port))
    if s.recv(1) != b"g":
        return 1
    s.setblocking(False)
    h, sent, longest, eagain, n = hashlib.sha256(), 0, 0.0, 0, 0
    start = time.time()
    blocked_since = None
    while time.time() - start < seconds:
        msg = b"%063d\n" % n
        t0 = time.time()
        try:
            k = s.send(msg)
            h.update(msg[:k])
            sent += k
            n += 1
            if k < len(msg):  # the rest, blocking: keeps the stream whole
                s.setblocking(True)
                s.sendall(msg[k:])
                h.update(msg[k:])
                sent += len(msg) - k
                s.setblocking(False)
            blocked_since = None
        except BlockingIOError:
            eagain += 1
            blocked_since = blocked_since or t0
            if t0 - blocked_since > 1.0:
                break
            time.sleep(0.002)
        longest = max(longest, time.time() - t0)
    t0 = time.time()
    select.select([], [s], [], 60)  # room again: the reader took what waited
    writable_after = time.time() - t0
    s.setblocking(True)
    s.shutdown(socket.SHUT_WR)
    answer = s.recv(200).decode().strip()
    s.close()
    print(json.dumps({"sent": sent, "longest_call_s": round(longest, 3), "eagain": eagain,
                      "writable_after_s": round(writable_after, 3), "sha256": h.hexdigest(), "answer": answer}, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(client(int(sys.argv[2]), float(sys.argv[3])))
