#!/usr/bin/env python3
"""A reader that looks at nothing for a while, and a writer of small
messages on a non-blocking socket (tests/softroce/guest/local_verbs.sh).

  server PORTFILE SLEEP [AWAY]
                          accept; greet ("g"); read nothing (no call on the
                          socket at all) for SLEEP s; then read to EOF as
                          an event loop does (select, non-blocking recv) and
                          answer the SHA-256 of what came; prints
                          {"got", "sha256", "end": "eof"|"reset"}
                          AWAY sleep (default): the process sleeps, its
                          threads run; stop: it stops itself (SIGSTOP, as a
                          debugger or ^Z would), every thread with it, and
                          its caller sends SIGCONT SLEEP s later
  client PORT SECONDS [END]
                          64 B messages, non-blocking, until SECONDS pass or
                          a send has had EAGAIN for 1 s; then END:
                          wait      (default) waits in select() until the
                                    socket is writable again (the reader is
                                    back), then shutdown(SHUT_WR) and the
                                    server's answer
                          shutdown  shutdown(SHUT_WR) at once, with the
                                    reader still away, then the answer
                          close     close() at once, with the reader still
                                    away; exit STAY s later (the reader is
                                    back by then)
                          exit      close() at once, and exit
                          quit      exit at once without closing (the
                                    socket's last name is a duplicate the
                                    interpreter's shutdown leaves open)

On TCP the writer fills the socket buffers and gets EAGAIN. Over verbs each
message is one WRITE WITH IMM, which takes one of the reader's posted
receives. A reader that sleeps has them reposted by its heartbeat thread
(SharedCq::tend), which also grows the reader's ring (x16,
VerbsLink::tend_regions), so the writer sends at least what TCP's buffers
would take; before, they ran out after 256 messages (31 KB sent). A stopped
reader reposts nothing: the
rest wait in our send queue (Soft-RoCE retries them without limit). Either
way the writer must then get EAGAIN as from a full buffer: before, its
send() spun until the reader came back. Prints {"sent", "longest_call_s", "eagain", "writable_after_s",
"sha256", "answer", "shutdown_s"}.
A shutdown() while the reader is stopped cannot wait for those writes to
land: its FIN must not end the stream before them (the Close frame,
Connection::announce_end). A close() leaves them to a background flush,
which delivers them once the reader is back, as TCP would
(Connection::linger_deadline). An exit waits for them at most the setup
timeout (one second for a socket it never closed), then stops the QP and
sends the rest on TCP (Connection::resend_unconfirmed): every byte, for a
stopped reader too.
"""
STAY = 12
import hashlib, json, os, select, signal, socket, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import HOST, accept_greeted  # staged beside us (tests/buffering/peers.py)


def server(portfile, sleep_s, away="sleep"):
    conn = accept_greeted(portfile)
    if away == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        time.sleep(sleep_s)
    h, n, end = hashlib.sha256(), 0, "eof"
    # Non-blocking: a read that finds the ring empty looks at the TCP side at
    # once (a blocking one spins on the ring first, where late writes land).
    conn.setblocking(False)
    while True:
        select.select([conn], [], [], 30)
        try:
            data = conn.recv(1 << 20)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            end = "reset"
            break
        if not data:
            break
        h.update(data)
        n += len(data)
    conn.setblocking(True)
    print(json.dumps({"got": n, "sha256": h.hexdigest(), "end": end}, separators=(",", ":")), flush=True)
    try:
        conn.sendall(("%d %s\n" % (n, h.hexdigest())).encode())
    except OSError:
        pass  # a writer that closed reads no answer
    conn.close()


def client(port, seconds, end="wait"):
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
    if end == "wait":
        select.select([], [s], [], 60)  # room again: the reader took what waited
    writable_after = time.time() - t0
    s.setblocking(True)
    answer, shut = "", 0.0
    if end in ("close", "exit"):
        s.close()
    elif end == "quit":
        os.dup(s.fileno())  # never closed: the stream is open at exit()
        s.close()
    else:
        t0 = time.time()
        s.shutdown(socket.SHUT_WR)
        shut = time.time() - t0
        answer = s.recv(200).decode().strip()
        s.close()
    print(json.dumps({"sent": sent, "longest_call_s": round(longest, 3), "eagain": eagain,
                      "writable_after_s": round(writable_after, 3), "sha256": h.hexdigest(), "answer": answer,
                      "shutdown_s": round(shut, 3)}, separators=(",", ":")), flush=True)
    if end == "close":
        time.sleep(STAY)  # the close's flush goes on meanwhile
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], float(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "sleep")
    else:
        sys.exit(client(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "wait"))
