#!/usr/bin/env python3
"""Both ends of the hostile shared-memory peer tests (hostile_peer.sh).

  hostile_peer.py attacker ATTACK ROLE WORK   run as another user under rdmashim
  hostile_peer.py victim   ATTACK ROLE WORK   run as root under rdmashim

ROLE is the victim's (client or server); the attacker takes the other one.
The server listens on 127.0.0.1 and writes its port to WORK/port.

The attacker is an ordinary rdmashim peer that, once the connection is on
shared memory, writes hostile values into the segment it maps (found as
its own /proc/self/fd entry) and tampers with its own doorbell descriptors:
  locks     the victim's side: every word after the cursors set to 0xff,
            then (at the offsets segment version 3 had them) users=2,
            rx_owner=1, tx_owner=1: a lock held by a live process (init);
            and the victim's published head moved 1000 bytes on
  doorbell  every eventfd it holds made blocking and its own filled to the
            maximum; every unix socket it holds made blocking and never
            read; its own sleeper word says "waiting for everything", with a
            new sleep every millisecond, and its ring count is huge;
            then it streams bytes to the victim
            so that the victim's reads credit it (and ring it).
Then it creates WORK/attacked and keeps the connection open.

The victim checks that it keeps the semantics TCP would give it: a
non-blocking recv returns at once (data or EAGAIN), a blocking recv with
SO_RCVTIMEO returns within its timeout, and waiting costs no CPU."""
import mmap, os, resource, select, socket, struct, sys, threading, time

what, attack, role, work = sys.argv[1:5]
attacker_role = "server" if role == "client" else "client"
my_role = role if what == "victim" else attacker_role


def connect():
    if my_role == "server":
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        with open(work + "/port.tmp", "w") as f:
            f.write(str(ls.getsockname()[1]))
        os.rename(work + "/port.tmp", work + "/port")
        s, _ = ls.accept()
        return s
    for _ in range(200):
        if os.path.exists(work + "/port"):
            break
        time.sleep(0.05)
    return socket.create_connection(("127.0.0.1", int(open(work + "/port").read())))


def handshake(s):
    # Two exchanges: the second one travels on the ring both ways, so both
    # directions switched (and read past their Switch).
    for word in (b"hi", b"ok"):
        s.sendall(word)
        got = b""
        while len(got) < 2:
            b = s.recv(2 - len(got))
            if not b:
                sys.exit("peer closed during the greeting")
            got += b
        time.sleep(0.1)


def own_fds(kind):
    out = []
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue
        if kind in target:
            out.append(int(name))
    return out


def attacker(s):
    memfds = own_fds("/memfd:rdmashim-ring")
    if not memfds:
        sys.exit("attacker: no rdmashim segment in this process (not upgraded?)")
    fd = memfds[0]
    seg = mmap.mmap(fd, os.fstat(fd).st_size)
    victim_side = 0 if role == "client" else 1
    mine = 64 + 192 * (1 - victim_side)
    theirs = 64 + 192 * victim_side
    if attack == "locks":
        seg[theirs + 128:theirs + 192] = b"\xff" * 64
        seg[theirs + 136:theirs + 148] = struct.pack("<Iii", 2, 1, 1)  # users, rx_owner, tx_owner (version 3)
        # The victim's own published head, moved: "there is something to read".
        head = struct.unpack("<Q", seg[theirs + 64:theirs + 72])[0]
        seg[theirs + 64:theirs + 72] = struct.pack("<Q", head + 1000)
    else:
        bells = own_fds("anon_inode:[eventfd]")
        for b in bells:
            os.set_blocking(b, False)
            try:
                os.read(b, 8)
            except OSError:
                pass
        if len(bells) == 2:  # version 3: memfd, client's doorbell, server's doorbell
            os.write(bells[1 - victim_side], struct.pack("<Q", 0xFFFFFFFFFFFFFFFE))
        for b in bells:
            os.set_blocking(b, True)
        for b in own_fds("socket:["):
            if b != s.fileno():
                try:
                    os.set_blocking(b, True)
                except OSError:
                    pass

        def sleeps():  # "a new sleep, waiting for data and space", forever
            n = 1
            while True:
                seg[mine + 128:mine + 136] = struct.pack("<Q", (n << 32) | 0x10001)
                n += 1
                time.sleep(0.001)

        seg[mine + 144:mine + 152] = struct.pack("<Q", 1 << 62)  # "I rang you that often" (version 4)
        threading.Thread(target=sleeps, daemon=True).start()
    open(work + "/attacked", "w").close()
    print("attacker: %s attack in place" % attack, flush=True)
    end = time.time() + 30
    while time.time() < end:
        if attack == "doorbell":
            s.setblocking(False)
            try:
                s.send(b"x" * 64)
            except OSError:
                pass
        time.sleep(0.005)


def victim(s):
    for _ in range(200):
        if os.path.exists(work + "/attacked"):
            break
        time.sleep(0.05)
    else:
        sys.exit("victim: the attacker never attacked")
    time.sleep(0.1)
    worst = 0.0
    got = 0

    def call(fn):
        nonlocal worst, got
        t = time.monotonic()
        try:
            got += len(fn())
            r = "data"
        except BlockingIOError:
            r = "EAGAIN"
        worst = max(worst, time.monotonic() - t)
        return r

    # Non-blocking reads: data or EAGAIN, at once.
    s.setblocking(False)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        call(lambda: s.recv(65536))
        time.sleep(0.002)
    nb_worst = worst
    # select() for reading, 200 ms at a time: readable must mean a recv
    # finds data (or the end), not a busy loop of empty wakes.
    empty = 0
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    while time.monotonic() < t0 + 1.0:
        if select.select([s], [], [], 0.2)[0] and call(lambda: s.recv(65536)) == "EAGAIN":
            empty += 1
    cpu1, poll_wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    poll_cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    # Blocking reads with SO_RCVTIMEO 200 ms: data or EAGAIN within it. The
    # CPU they cost while waiting (no data in the locks case) must be small.
    s.setblocking(True)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200000))
    worst = 0.0
    results = set()
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    end = t0 + 1.5
    while time.monotonic() < end:
        results.add(call(lambda: s.recv(65536)))
    cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    print("victim: non-blocking recv worst %.3f s; select: %d empty wakes, CPU %.2f s in %.2f s; "
          "SO_RCVTIMEO recv worst %.3f s (%s); %d bytes; CPU %.2f s in %.2f s"
          % (nb_worst, empty, poll_cpu, poll_wall, worst, "/".join(sorted(results)), got, cpu, wall), flush=True)
    fail = []
    if nb_worst > 0.25:
        fail.append("a non-blocking recv took %.3f s" % nb_worst)
    if worst > 0.7:
        fail.append("a recv with SO_RCVTIMEO 200 ms took %.3f s" % worst)
    if attack == "locks" and "EAGAIN" not in results:
        fail.append("SO_RCVTIMEO never fired")
    if attack == "doorbell" and got == 0:
        fail.append("no byte of the attacker's stream arrived")
    if empty > 20:
        fail.append("select reported readable %d times with nothing to read" % empty)
    if poll_cpu > 0.3 * poll_wall:
        fail.append("waiting in select cost %.2f s of CPU in %.2f s" % (poll_cpu, poll_wall))
    if cpu > 0.3 * wall:
        fail.append("waiting cost %.2f s of CPU in %.2f s" % (cpu, wall))
    if fail:
        sys.exit("victim: FAIL: " + "; ".join(fail))
    print("victim: ok", flush=True)


s = connect()
handshake(s)
(attacker if what == "attacker" else victim)(s)
