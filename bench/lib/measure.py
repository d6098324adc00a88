# The measurements of bench/run: each runs the project's tools (tcpPingPong,
# rdmaPingPong, `rdmashim run`) and returns plain dicts. Every measurement is
# taken for the same four kinds of connection, back to back in one run:
#   tcp      tcpPingPong --local          kernel TCP over loopback (the baseline)
#   unix     tcpPingPong --local --unix   an abstract Unix domain socket
#   preload  rdmashim run -- tcpPingPong  the same unmodified binary, upgraded
#   core     rdmaPingPong --local         rdmashim's core API (core/api/stream.h)
import json
import os
import re
import resource
import signal
import subprocess
import time

KINDS = ["tcp", "unix", "preload", "core"]


class Tools:
    def __init__(self, build):
        self.bin = os.path.join(build, "bin")
        self.errors = []  # (what, message): runs that failed, reported in the summary

    def argv(self, kind, args):
        tcp = [os.path.join(self.bin, "tcpPingPong"), "--local", "--json"]
        if kind == "tcp":
            return tcp + args
        if kind == "unix":
            return tcp + ["--unix"] + args
        if kind.startswith("preload"):
            return [os.path.join(self.bin, "rdmashim"), "run", "--"] + tcp + args
        if kind == "core":
            return [os.path.join(self.bin, "rdmaPingPong"), "--local", "--json"] + args
        raise ValueError(kind)

    def env(self, kind, extra=None):
        e = dict(os.environ)
        if kind.startswith("preload"):
            # info: one line per connection (never per call), to check shm was taken
            e["RDMASHIM_LOG"] = "info"
        if kind == "preload-every":
            e["RDMASHIM_SHORT_CONN_MS"] = "0"  # every connection upgraded
        e.update(extra or {})
        return e

    def run(self, kind, args, timeout=120, extra_env=None):
        need = ("bytes_per_s" if "--stream" in args else "connections_per_s" if "--connects" in args
                else "client_fds" if "--hold" in args else "round_trips_per_s")
        """One tool run: its JSON report plus cpu_s (user+sys of the tool
        and its forked server), upgraded (preload: some connection took shm)
        and wall_s; None when it failed."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        try:
            p = subprocess.run(self.argv(kind, args), env=self.env(kind, extra_env), capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.errors.append((f"{kind} {' '.join(args)}", f"timed out after {timeout} s"))
            return None
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        if p.returncode != 0 or not line.startswith("{"):
            self.errors.append((f"{kind} {' '.join(args)}", f"exit {p.returncode}: {p.stderr.strip()[-300:]}"))
            return None
        r = json.loads(line)
        if need not in r:
            self.errors.append((f"{kind} {' '.join(args)}", f"no {need} in its report: {line[:200]}"))
            return None
        r["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        r["wall_s"] = wall
        if kind.startswith("preload"):
            r["upgraded"] = bool(re.search(r"-> shm", p.stderr))
            r["shm_sides"] = len(re.findall(r"-> shm", p.stderr))  # one line per side per connection
            clients = re.findall(r"\(client\) -> (\S+)", p.stderr)
            # --then's busy connections are the last ones the client opened
            busy = r.get("then_busy", 0) if "then_round_trips_per_s" in r else 0
            r["then_client_shm"] = sum(c == "shm" for c in clients[len(clients) - busy:]) if busy else 0
        return r


def background(samples=10, interval=0.05):
    """Runnable threads of other programs right now: the mean of /proc/loadavg's
    runnable count (minus the reader) over samples * interval seconds."""
    total = 0
    for _ in range(samples):
        total += max(0, int(open("/proc/loadavg").read().split()[3].split("/")[0]) - 1)
        time.sleep(interval)
    return total / samples


def quiet(wait_s):
    """Waits up to wait_s seconds for the others to leave the CPUs (bg < 0.5); returns bg."""
    start = time.monotonic()
    while True:
        bg = background()
        if bg < 0.5 or time.monotonic() - start >= wait_s:
            return bg


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[(len(xs) - 1) // 2] if xs else None


def sizes(lo, hi, step=4):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    return out


def warmup_for(size, most):
    # Enough round trips to get past the first milliseconds, without making
    # a 1 MiB TCP run spend seconds warming up.
    return most if size <= 4096 else max(20, min(most, int(4e7 // size)))


CONVERGED = 0.05  # a latency row converged when its two halves' rates are this close


def latency(t, size_list, ms, warmup, kinds=KINDS):
    """Ping-pong per size: round trips/s, p50/p99/p99.9 after warm-up, the
    warm-up itself (rate of the first 1,000, time until steady), and whether
    the rate had stopped moving: the second half of the measured round trips
    against the first (half_change; converged within CONVERGED)."""
    out = []
    for size in size_list:
        for kind in kinds:
            r = t.run(kind, ["--size", str(size), "--iters", "100000000", "--warmup", str(warmup_for(size, warmup)),
                             "--ms", str(ms)])
            if r and r.get("first_half_per_s"):
                r["half_change"] = r["second_half_per_s"] / r["first_half_per_s"] - 1
                r["converged"] = abs(r["half_change"]) <= CONVERGED
            out.append({"kind": kind, "size": size, "result": r})
    return out


def cold_start(t, iters, repeat):
    """The 64 B ping-pong from the first round trip (no warm-up): iters round trips."""
    out = []
    for i in range(repeat):
        for kind in KINDS:
            r = t.run(kind, ["--size", "64", "--iters", str(iters), "--warmup", "1"])
            out.append({"kind": kind, "rep": i, "result": r})
    return out


def stream_once(t, kind, size, seconds, extra=None):
    # A short pilot sizes the measured run to about `seconds`.
    pilot = min(max(size * 2000, 64 << 10), 64 << 20)
    pilot -= pilot % size
    p = t.run(kind, ["--stream", "--size", str(size), "--bytes", str(pilot)])
    if not p:
        return None
    total = int(min(max(p["bytes_per_s"] * seconds, pilot), 16 << 30))
    total -= total % size
    return t.run(kind, ["--stream", "--size", str(size), "--bytes", str(total)] + (extra or []))


def stream(t, size_list, seconds, kinds=KINDS):
    """One-way stream of size-byte writes: bytes/s, messages/s, CPU per GB."""
    out = []
    for size in size_list:
        for kind in kinds:
            r = stream_once(t, kind, size, seconds)
            if r:
                r["msgs_per_s"] = r["bytes_per_s"] / size
                r["cpu_s_per_gb"] = r["cpu_s"] / (r["bytes"] / 1e9)
            out.append({"kind": kind, "size": size, "result": r})
    return out


def paced(t, max_rates, size, fractions, seconds, repeat):
    """A stream paced at fractions of each kind's measured maximum."""
    out = []
    for kind, top in max_rates.items():
        for f in fractions:
            for i in range(repeat):
                rate = int(top * f)
                total = max(size, int(rate * seconds) // size * size)
                r = t.run(kind, ["--stream", "--size", str(size), "--bytes", str(total), "--rate", str(rate)])
                if r:
                    r["target_bytes_per_s"] = rate
                    r["achieved_ratio"] = r["bytes_per_s"] / rate
                out.append({"kind": kind, "fraction": f, "rep": i, "result": r})
    return out


def connections(t, n, repeat):
    """connect + one 64 B exchange + close, n times (tcpPingPong --connects;
    rdmaPingPong has no such mode: the core API's row is absent)."""
    out = []
    for i in range(repeat):
        for kind in ["tcp", "unix", "preload", "preload-every"]:
            # The rate runs log at the default level, as users run: RDMASHIM_LOG=info
            # writes a line per connection to a pipe, which cost a third of the rate.
            r = t.run(kind, ["--connects", str(n)], extra_env={"RDMASHIM_LOG": "warn"})
            if r and kind.startswith("preload"):
                # Which transport the connections take is checked by a short run
                # of the same kind with the per-connection info lines.
                check = t.run(kind, ["--connects", "20"])
                r["upgraded"] = bool(check and check["upgraded"])
                r["checked_shm_sides"] = check["shm_sides"] if check else 0
            out.append({"kind": kind, "rep": i, "result": r})
    return out


class Hogs:
    """CPU hogs (`yes > /dev/null`, not pinned) beside a measurement."""

    def __init__(self, n):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


def busy(t, pair_counts, hog_counts, ms):
    """N 64 B ping-pong pairs at once (each its own client and server), with
    and without CPU hogs: the sum of their round trips/s."""
    out = []
    for hogs in hog_counts:
        for pairs in pair_counts:
            for kind in KINDS:
                with Hogs(hogs):
                    args = ["--size", "64", "--iters", "100000000", "--warmup", "1000", "--ms", str(ms)]
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    procs = [subprocess.Popen(t.argv(kind, args), env=t.env(kind), stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True) for _ in range(pairs)]
                    rates, ok, upgraded = [], True, True
                    for p in procs:
                        try:
                            so, se = p.communicate(timeout=ms / 1000 + 60)
                        except subprocess.TimeoutExpired:
                            p.kill()
                            so, se = p.communicate()
                        if p.returncode != 0 or not so.strip().startswith("{"):
                            ok = False
                            t.errors.append((f"busy {kind} x{pairs} hogs {hogs}", se.strip()[-300:]))
                            continue
                        rates.append(json.loads(so.strip().splitlines()[-1])["round_trips_per_s"])
                        if kind == "preload" and "-> shm" not in se:
                            upgraded = False
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                r = None
                if ok:
                    r = {"round_trips_per_s": sum(rates), "per_pair": rates,
                         "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime}
                    if kind == "preload":
                        r["upgraded"] = upgraded
                out.append({"kind": kind, "pairs": pairs, "hogs": hogs, "result": r})
    return out


def memory(t, total):
    """What an idle connection holds after moving `total` bytes (64 KiB writes)."""
    out = []
    for kind in ["tcp", "unix", "preload"]:
        r = t.run(kind, ["--stream", "--size", "65536", "--bytes", str(total), "--idle-ms", "300"])
        out.append({"kind": kind, "result": r})
    return out


def descriptors(t, n):
    """n connections open at once: descriptors of each side (tcpPingPong --hold),
    at the systemd default soft limit of 1024."""
    out = []
    for kind in ["tcp", "preload"]:
        lim = resource.getrlimit(resource.RLIMIT_NOFILE)
        soft = min(1024, lim[1]) if lim[1] != resource.RLIM_INFINITY else 1024
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, lim[1]))
        try:
            r = t.run(kind, ["--hold", str(n)])
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, lim)
        out.append({"kind": kind, "result": r})
    return out


def scale(t, n, busy_iters, busy=10):
    """n connections open at once in one client process against one server
    (tcpPingPong --hold, soft RLIMIT_NOFILE raised to n + 1024, what the
    program needs, as its user would raise it; the hard limit as it is, where
    the descriptor budget puts rdmashim's own descriptors): how
    many upgraded, descriptors and resident memory per connection, and
    `busy` busy connections beside them (--then --busy: busy_iters 64 B
    round trips each, all at once, a thread each on both sides; their total
    rate and the p99 of all their round trips), against the same with one
    idle connection (idle=1)."""
    out = []
    lim = resource.getrlimit(resource.RLIMIT_NOFILE)
    for idle in (n, 1):
        for kind in ["tcp", "preload"]:
            soft = min(lim[1], idle + 1024) if lim[1] != resource.RLIM_INFINITY else idle + 1024
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, lim[1]))
            try:
                r = t.run(kind, ["--hold", str(idle), "--then", str(busy_iters), "--busy", str(busy)], timeout=300)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, lim)
            if r:
                r["nofile_limit"] = lim[1]
                r["nofile_soft"] = soft
            out.append({"kind": kind, "idle": idle, "result": r})
    return out


def micro(build, min_time):
    """bench/micro/ring_bench (Google Benchmark): the ring's hot operations."""
    exe = os.path.join(build, "bin", "ring_bench")
    if not os.access(exe, os.X_OK):
        return {"rows": [], "skipped_reason": "ring_bench not built (libbenchmark-dev missing)"}
    p = subprocess.run([exe, "--benchmark_format=json", f"--benchmark_min_time={min_time}"], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        return {"rows": [], "error": p.stderr.strip()[-300:]}
    rows = []
    for b in json.loads(p.stdout)["benchmarks"]:
        scale_ns = {"ns": 1, "us": 1e3, "ms": 1e6}.get(b.get("time_unit", "ns"), 1)
        rows.append({"kind": "ring", "name": b["name"], "result": {
            "real_ns": b["real_time"] * scale_ns, "cpu_ns": b["cpu_time"] * scale_ns,
            "bytes_per_s": b.get("bytes_per_second", 0), "iterations": b["iterations"]}})
    return {"rows": rows}


def memcpy_bytes_per_s(mib=64, reps=8):
    """One-thread memcpy bandwidth (a bytearray slice copy is one memcpy)."""
    a, b = bytearray(os.urandom(1 << 20) * mib), bytearray(mib << 20)
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        b[:] = a
        best = max(best, len(a) / (time.perf_counter() - t0))
    return best


# One row of bench/servers' table: workload, TCP tx/s, CPU us/tx, shim tx/s,
# CPU us/tx, ratio, bg, shm conns (on shm/all), target, result.
SERVER_ROW = re.compile(r"^((?:pgbench|redis|nginx).*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+(\S+)"
                        r"\s+(\d+)/(\d+)\s+(\S+)\s+(.*)$")


def servers(root, build, duration, rows, only=None, install=True):
    """bench/servers' rows (PostgreSQL, Redis, nginx; TCP vs rdmashim), parsed from its table."""
    env = dict(os.environ, RDMASHIM_BUILD=build)
    args = [os.path.join(root, "bench", "servers"), "--duration", str(duration)] + (["--rows", rows] if rows else [])
    args += (["--only", only] if only else []) + ([] if install else ["--no-install"])
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1200)
    out = []
    for line in p.stdout.splitlines():
        m = SERVER_ROW.match(line)
        if not m:
            continue
        f = m.groups()
        shm, conns = int(f[7]), int(f[8])
        out.append({"workload": f[0], "tcp_tx_per_s": float(f[1]), "tcp_cpu_us_per_tx": float(f[2]),
                    "preload_tx_per_s": float(f[3]), "preload_cpu_us_per_tx": float(f[4]), "ratio": float(f[5]),
                    "bg": f[6], "shm_conns": shm, "conns": conns, "upgraded": shm > 0, "verdict": f[10].strip()})
    if not out:
        why = (p.stdout + p.stderr).strip()
        if p.returncode == 77:  # a package missing: "SKIP: ..."
            return {"rows": [], "skipped_reason": next((l[6:] for l in why.splitlines() if l.startswith("SKIP: ")), why[-400:])}
        return {"rows": [], "error": f"exit {p.returncode}: {why[-400:]}"}
    return {"rows": out}


def verbs(root, build, out):
    """The Soft-RoCE ping-pong tables (bench/softroce.sh: one guest, then two
    guests, in qemu), from their JSON. Each row's kind is "1guest:<row>" or
    "2guests:<row>" (tcp, shim, rspreload, core, ibl, auto)."""
    path = os.path.join(out, "softroce.json")
    env = dict(os.environ, RDMASHIM_BUILD=build)
    try:
        p = subprocess.run([os.path.join(root, "bench", "softroce.sh"), "--json", path], env=env,
                           capture_output=True, text=True, timeout=2400)
    except subprocess.TimeoutExpired:
        return {"rows": [], "error": "bench/softroce.sh ran past 40 minutes"}
    if p.returncode == 77:
        return {"rows": [], "skipped_reason": "no qemu guests here: " + (p.stdout + p.stderr).strip()[-300:]}
    rows, tables = [], {}
    for key, f in (("1guest", path), ("2guests", path + ".cross")):
        try:
            with open(f) as fh:
                t = json.loads(fh.readline())
        except (OSError, ValueError):
            continue
        tables[key] = {k: v for k, v in t.items() if k != "rows"}
        for r in t["rows"]:
            result = {k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            rows.append({"kind": f"{key}:{r['row']}", "what": r["what"], "result": result if r["ok"] else None,
                         "error": r.get("error")})
    if not rows:
        return {"rows": [], "error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}
    return {"rows": rows, "tables": tables, "table_text": p.stdout}
