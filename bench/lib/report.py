# bench/run's outputs: the targets (ratios from this run's measurements,
# PASS/FAIL/SKIP), results.json, results.csv, the PNG plots and summary.md.
import csv
import json
import os

from measure import CONVERGED, KINDS, median, warmup_for

LABEL = {"tcp": "TCP loopback", "unix": "Unix socket", "preload": "rdmashim (preload)",
         "preload-every": "rdmashim, every conn. upgraded", "core": "rdmashim core API"}


def pick(rows, **kw):
    """Results of `rows` whose fields match kw (None results dropped)."""
    return [r["result"] for r in rows if r.get("result") and all(r.get(k) == v for k, v in kw.items())]


def one(rows, field, **kw):
    got = pick(rows, **kw)
    return got[0].get(field) if got else None


def ratio(a, b):
    return a / b if a is not None and b else None


def paired_median(rows, field, a, b, key="rep"):
    """Median over repetitions of the same-repetition ratio a/b."""
    reps = sorted({r.get(key) for r in rows})
    return median([ratio(one(rows, field, kind=a, **{key: i}), one(rows, field, kind=b, **{key: i})) for i in reps])


def targets(res):
    """[(figure, measured text, target text, verdict)] for the issue's table."""
    out = []

    def add(figure, measured, target, ok, why_skip=None):
        verdict = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        out.append({"figure": figure, "measured": measured if ok is not None else (why_skip or "not measured"),
                    "target": target, "verdict": verdict})

    lat = res["sections"].get("latency", {}).get("rows", [])
    rt = lambda kind: one(lat, "round_trips_per_s", kind=kind, size=64)
    vs_tcp, vs_core, vs_unix = ratio(rt("preload"), rt("tcp")), ratio(rt("preload"), rt("core")), ratio(rt("preload"), rt("unix"))
    add("64 B ping-pong, steady", f"{vs_tcp or 0:.1f}x TCP, {vs_core or 0:.2f}x core ({rt('preload') or 0:.0f} vs {rt('tcp') or 0:.0f} RT/s)",
        ">= 100x TCP, >= 0.8x core", None if vs_tcp is None or vs_core is None else vs_tcp >= 100 and vs_core >= 0.8)
    cold = res["sections"].get("cold_start", {}).get("rows", [])
    c = paired_median(cold, "round_trips_per_s", "preload", "tcp") if cold else None
    add(f"64 B ping-pong, {res['config']['cold_iters']:,} iterations from a cold start", f"{c or 0:.1f}x TCP",
        ">= 50x TCP", None if c is None else c >= 50)
    add("vs Unix domain sockets, 64 B ping-pong", f"{vs_unix or 0:.1f}x ({rt('unix') or 0:.0f} RT/s Unix)", ">= 20x",
        None if vs_unix is None else vs_unix >= 20)

    st = res["sections"].get("stream", {}).get("rows", [])
    bw = lambda kind, size=65536: one(st, "bytes_per_s", kind=kind, size=size)
    s_tcp, half = ratio(bw("preload"), bw("tcp")), res["machine"].get("memcpy_bytes_per_s", 0) / 2
    s_half = ratio(bw("preload"), half)
    add("64 KiB stream", f"{s_tcp or 0:.1f}x TCP, {(bw('preload') or 0) / 1e9:.1f} GB/s = {s_half or 0:.2f}x half memcpy ({half / 1e9:.1f} GB/s)",
        ">= 4x TCP, >= 0.8x half memcpy", None if s_tcp is None or s_half is None else s_tcp >= 4 and s_half >= 0.8)
    msg = lambda kind, size: one(st, "msgs_per_s", kind=kind, size=size)
    m64 = ratio(msg("preload", 64), msg("tcp", 64))
    small = sorted(s for s in res["config"]["msgrate_sizes"] if msg("preload", s))
    # Never falling as size shrinks: each size at least 0.9x the next larger (noise allowance).
    falls = [f"{b}->{a} B" for a, b in zip(small, small[1:]) if msg("preload", a) < 0.9 * msg("preload", b)]
    add("64 B message rate", f"{m64 or 0:.1f}x TCP; " + (f"falls at {', '.join(falls)}" if falls else "never falls as size shrinks"),
        ">= 10x TCP, never falling as size shrinks", None if m64 is None else m64 >= 10 and not falls)

    conn = res["sections"].get("connections", {}).get("rows", [])
    cr = paired_median(conn, "connections_per_s", "preload", "tcp") if conn else None
    add("connections/s", f"{cr or 0:.2f}x TCP", ">= 1.0x", None if cr is None else cr >= 1.0)

    mem = res["sections"].get("memory", {}).get("rows", [])
    held = one(mem, "idle_conn_bytes", kind="preload")
    add(f"memory per idle connection after {res['config']['memory_bytes'] >> 20} MiB",
        f"{(held or 0) / 1024:.0f} KiB (TCP {(one(mem, 'idle_conn_bytes', kind='tcp') or 0) / 1024:.0f} KiB)",
        "<= 64 KiB", None if held is None else held <= 65536)

    fds = res["sections"].get("descriptors", {}).get("rows", [])
    n = res["config"]["hold"]
    per, low = {}, {}
    for side in ("client", "server"):
        for out_, field in ((per, f"{side}_fds"), (low, f"{side}_low_fds")):
            a, b = one(fds, field, kind="preload"), one(fds, field, kind="tcp")
            out_[side] = (a - b) / n if a is not None and b is not None else None
    okd = None if None in per.values() else all(v <= 0 for v in per.values())
    add("descriptors per upgraded connection", f"client {per['client'] or 0:+.2f}, server {per['server'] or 0:+.2f} per connection "
        f"(below the soft limit 1024: {low['client'] or 0:+.2f}, {low['server'] or 0:+.2f})", "0 extra in steady state", okd)

    srv = res["sections"].get("servers", {})
    why = srv.get("skipped_reason") or srv.get("error")
    for name, goal in (("pgbench -S, 8 clients", 1.3), ("redis GET, 50 clients", 2.5)):
        row = next((r for r in srv.get("rows", []) if r["workload"].startswith(name)), None)
        add(name, f"{row['ratio']:.2f}x TCP (bg {row['bg']})" if row else None, f">= {goal}x",
            None if row is None else row["ratio"] >= goal, why_skip=why or "not in this run")
    # Counted only when every connection took shm: a ratio of TCP to TCP is no speed-up.
    row = next((r for r in srv.get("rows", []) if r["workload"] == "nginx 1 KiB, 16 keep-alive"), None)
    add("nginx + wrk, 16 keep-alive connections",
        f"{row['ratio']:.2f}x TCP, 1 KiB file ({row['shm_conns']} of {row['conns']} connections on shm, bg {row['bg']})"
        if row else None, ">= 1.5x, every connection on shm",
        None if row is None else row["ratio"] >= 1.5 and row["conns"] > 0 and row["shm_conns"] == row["conns"],
        why_skip=why or "not in this run")

    busy = res["sections"].get("busy", {}).get("rows", [])
    b4 = ratio(one(busy, "round_trips_per_s", kind="preload", pairs=4, hogs=0), one(busy, "round_trips_per_s", kind="tcp", pairs=4, hogs=0))
    add("4 ping-pong pairs on 2 cores", f"{b4 or 0:.2f}x TCP", ">= 1.0x TCP", None if b4 is None else b4 >= 1.0)
    worst = None
    for r in busy:
        if r["kind"] != "preload":
            continue
        q = ratio(one(busy, "round_trips_per_s", kind="preload", pairs=r["pairs"], hogs=r["hogs"]),
                  one(busy, "round_trips_per_s", kind="tcp", pairs=r["pairs"], hogs=r["hogs"]))
        if q is not None and (worst is None or q < worst[0]):
            worst = (q, r["pairs"], r["hogs"])
    add("busy machine: never below TCP (1/2/4 pairs, 0/1/2 hogs)",
        f"lowest {worst[0]:.2f}x TCP ({worst[1]} pairs, {worst[2]} hogs)" if worst else None, ">= 1.0x everywhere",
        None if worst is None else worst[0] >= 1.0)

    pc = res["sections"].get("paced", {}).get("rows", [])
    devs = [abs(r["result"]["achieved_ratio"] - 1) for r in pc if r["kind"] == "preload" and r.get("result")]
    add("paced stream within 5% of target (rdmashim)", f"worst {max(devs) * 100:.1f}% off" if devs else None,
        "<= 5% at 10-100% of max", None if not devs else max(devs) <= 0.05)

    vb = res["sections"].get("verbs", {})
    vrt = lambda kind: one(vb.get("rows", []), "round_trips_per_s", kind=kind)
    v_ibl = ratio(vrt("1guest:shim"), vrt("1guest:ibl"))
    add("verbs 64 B ping-pong, one Soft-RoCE guest", f"{v_ibl or 0:.2f}x ib_write_lat ({vrt('1guest:shim') or 0:.0f} vs "
        f"{vrt('1guest:ibl') or 0:.0f} RT/s)", ">= 0.8x ib_write_lat", None if v_ibl is None else v_ibl >= 0.8,
        why_skip=vb.get("skipped_reason") or vb.get("error"))
    v_auto = ratio(vrt("2guests:auto"), vrt("2guests:tcp"))
    add("across two Soft-RoCE guests, auto", f"{v_auto or 0:.2f}x TCP (stays on TCP)", ">= 0.9x TCP (noise allowance)",
        None if v_auto is None else v_auto >= 0.9, why_skip=vb.get("skipped_reason") or vb.get("error"))
    return out


def csv_rows(res):
    """Long format: one measured number per line."""
    fields = ["section", "kind", "size", "pairs", "hogs", "fraction", "rep", "metric", "value"]
    out = []
    for name, sec in res["sections"].items():
        for r in sec.get("rows", []):
            result = r.get("result", r)
            if not result:
                out.append({"section": name, "kind": r.get("kind", ""), "metric": "error", "value": ""})
                continue
            for metric, value in result.items():
                if isinstance(value, bool):
                    value = int(value)
                if isinstance(value, (int, float)):
                    row = {k: r.get(k, "") for k in fields[1:7]}
                    row.update(section=name, metric=metric, value=value)
                    if name == "servers":
                        row["kind"] = r.get("workload", "")
                    out.append(row)
        if sec.get("skipped_reason"):
            out.append({"section": name, "metric": "skipped", "value": sec["skipped_reason"]})
    for t in res["targets"]:
        out.append({"section": "targets", "kind": t["figure"], "metric": t["verdict"], "value": t["measured"]})
    return fields, out


def write_files(res, out):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    fields, rows = csv_rows(res)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})


def plots(res, out):
    """PNG plots, one message each; returns [(file, caption)]."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []

    def sweep(section, field, ylabel, title, name, kinds=KINDS, scale=1.0, logy=True, most=None):
        rows = [r for r in res["sections"].get(section, {}).get("rows", []) if most is None or r["size"] <= most]
        if not rows:
            return
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for kind in kinds:
            pts = [(r["size"], r["result"][field] * scale) for r in rows
                   if r["kind"] == kind and r.get("result") and r["result"].get(field) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=LABEL[kind])
        ax.set_xscale("log", base=2)
        ticks = sorted({p for r in rows for p in [r["size"]]})
        ax.set_xticks(ticks)
        ax.set_xticklabels([fmt_size(x).replace(" ", "") for x in ticks], rotation=45)
        ax.tick_params(axis="x", which="minor", bottom=False)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("message size (bytes, log scale)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=100)
        plt.close(fig)
        made.append((name, title))

    sweep("latency", "round_trips_per_s", "round trips/s (log)", "Ping-pong: round trips per second by size", "latency_rate.png")
    sweep("latency", "p99_us", "p99 round trip (us, log)", "Ping-pong: p99 round-trip time by size", "latency_p99.png")
    sweep("stream", "bytes_per_s", "GB/s (log)", "One-way stream: throughput by write size", "throughput.png", scale=1e-9)
    sweep("stream", "cpu_s_per_gb", "CPU s (user+sys) per GB (log)", "One-way stream: CPU per GB moved", "cpu_per_gb.png")
    sweep("stream", "msgs_per_s", "messages/s (log)", "Message rate by size (must not fall as size shrinks)", "msgrate.png",
          most=max(res["config"]["msgrate_sizes"]))

    busy = res["sections"].get("busy", {}).get("rows", [])
    if busy:
        combos = sorted({(r["hogs"], r["pairs"]) for r in busy})
        fig, ax = plt.subplots(figsize=(8, 4.2))
        width = 0.8 / len(KINDS)
        for i, kind in enumerate(KINDS):
            ys = [one(busy, "round_trips_per_s", kind=kind, pairs=p, hogs=h) or 0 for h, p in combos]
            ax.bar([x + i * width for x in range(len(combos))], ys, width, label=LABEL[kind])
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(combos))])
        ax.set_xticklabels([f"{p} pairs\n{h} hog(s)" for h, p in combos])
        ax.set_yscale("log")
        ax.set_ylabel("total round trips/s, 64 B (log)")
        ax.set_title(f"Busy machine: ping-pong pairs on {res['machine']['cpus']} CPUs")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "busy.png"), dpi=100)
        plt.close(fig)
        made.append(("busy.png", "Busy machine"))

    pc = res["sections"].get("paced", {}).get("rows", [])
    if pc:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for kind in KINDS:
            pts = sorted((r["fraction"] * 100, r["result"]["achieved_ratio"] * 100) for r in pc if r["kind"] == kind and r.get("result"))
            if pts:
                ax.plot(*zip(*pts), marker="o", linestyle="", label=LABEL[kind])
        ax.axhspan(95, 105, color="green", alpha=0.1, label="within 5%")
        ax.set_xlabel("target rate (% of that transport's measured maximum)")
        ax.set_ylabel("achieved / target (%)")
        ax.set_title("Paced 64 KiB stream: achieved rate against target")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "paced.png"), dpi=100)
        plt.close(fig)
        made.append(("paced.png", "Paced stream"))
    return made


def fmt_size(n):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return f"{n} B"


def targets_table(res):
    lines = [f"| figure | measured in this run | target ({res['machine']['cpus']} CPUs) | result |", "|---|---|---|---|"]
    for t in res["targets"]:
        lines.append(f"| {t['figure']} | {t['measured']} | {t['target']} | {t['verdict']} |")
    return "\n".join(lines)


def sweep_table(rows, field, fmt, kinds=KINDS):
    sizes = sorted({r["size"] for r in rows})
    lines = ["| size | " + " | ".join(LABEL[k] for k in kinds) + " | rdmashim / TCP |", "|---" * (len(kinds) + 2) + "|"]
    for s in sizes:
        vals = [one(rows, field, kind=k, size=s) for k in kinds]
        q = ratio(one(rows, field, kind="preload", size=s), one(rows, field, kind="tcp", size=s))
        lines.append(f"| {fmt_size(s)} | " + " | ".join("-" if v is None else fmt(v) for v in vals) +
                     f" | {'-' if q is None else f'{q:.2f}x'} |")
    return "\n".join(lines)


def convergence_cell(results):
    r = results[0] if results else None
    if not r or "half_change" not in r:
        return "-"
    return f"{r['half_change']:+.1%}" + ("" if r["converged"] else " **NOT CONVERGED**")


def not_converged_line(res):
    """The latency rows whose rate was still moving (halves more than CONVERGED apart)."""
    lat = res["sections"].get("latency", {}).get("rows", [])
    bad = [f"{fmt_size(r['size'])} {LABEL[r['kind']]} ({r['result']['half_change']:+.1%})" for r in lat
           if r.get("result") and r["result"].get("converged") is False]
    if not lat:
        return "Latency: not measured."
    if bad:
        return (f"Latency rows NOT CONVERGED (the second half of the measured window more than {CONVERGED:.0%} from the "
                f"first): {', '.join(bad)}; their figures were still moving.")
    return f"Latency: every row converged (the two halves of each measured window within {CONVERGED:.0%})."


def summary(res, made):
    m, cfg = res["machine"], res["config"]
    s = res["sections"]
    md = [f"# rdmashim benchmark: `bench/run{' --' + cfg['mode'] if cfg['mode'] != 'full' else ''}`", "",
          f"Run {res['started']} on {m['cpus']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, commit {res['commit']}; "
          f"load average {m['load_before']} before, {m['load_after']} after; wall time {res['wall_s']:.0f} s. "
          f"One-thread memcpy {m['memcpy_bytes_per_s'] / 1e9:.1f} GB/s.", "",
          "Every figure below was measured in this run, the transports back to back, so the ratios hold "
          "on a shared machine even where the absolute figures move. Kinds: TCP loopback (`tcpPingPong --local`), "
          "Unix socket (`tcpPingPong --local --unix`), rdmashim (`rdmashim run -- tcpPingPong --local`, checked "
          "upgraded to shm), core API (`rdmaPingPong --local`). See docs/bench.md.", "",
          "## Targets", "", targets_table(res), "", not_converged_line(res), "",
          "bg (runnable threads of other programs when each section started; on 2 CPUs, near or above 1 means "
          "the run shared the machine and spinning could not pay): " +
          ", ".join(f"{k} {v['bg']:.1f}" for k, v in s.items() if "bg" in v) + ".", ""]
    lat = s.get("latency", {}).get("rows", [])
    if lat:
        md += ["## Latency: ping-pong", "", f"{cfg['latency_ms']} ms per size and transport after the warm-up.", "",
               "Round trips/s:", "", sweep_table(lat, "round_trips_per_s", lambda v: f"{v:,.0f}"), "",
               "p50 / p99 / p99.9 round trip (us):", "",
               "| size | " + " | ".join(LABEL[k] for k in KINDS) + " |\n" +
               "|---" * (len(KINDS) + 1) + "|\n" +
               "\n".join(f"| {fmt_size(z)} | " + " | ".join(
                   "/".join(f"{one(lat, f, kind=k, size=z) or 0:.1f}" for f in ("p50_us", "p99_us", "p999_us")) for k in KINDS) + " |"
                   for z in sorted({r["size"] for r in lat})), "",
               "CPU per round trip, both processes (user+sys over the whole run, warm-up and start-up included: "
               "spinning shows here), us:", "",
               sweep_table([dict(r, result=dict(r["result"], cpu_us_per_rt=r["result"]["cpu_s"] * 1e6 /
                                                (r["result"]["iters"] + warmup_for(r["size"], cfg["warmup"]))))
                            for r in lat if r.get("result")], "cpu_us_per_rt", lambda v: f"{v:.1f}"), "",
               f"Convergence: the rate of the second half of the measured round trips against the first "
               f"(converged when within {CONVERGED:.0%}; **NOT CONVERGED** otherwise: that row's figures were still moving, "
               "a longer run or a quieter machine would change them):", "",
               "| size | " + " | ".join(LABEL[k] for k in KINDS) + " |", "|---" * (len(KINDS) + 1) + "|"]
        md += [f"| {fmt_size(z)} | " + " | ".join(convergence_cell(pick(lat, kind=k, size=z)) for k in KINDS) + " |"
               for z in sorted({r["size"] for r in lat})]
        md += ["", "Warm-up (reported apart from the steady figures): rate of the first 1,000 round trips / time until steady (us):", "",
               "| size | " + " | ".join(LABEL[k] for k in KINDS) + " |", "|---" * (len(KINDS) + 1) + "|"]
        md += [f"| {fmt_size(z)} | " + " | ".join(f"{one(lat, 'first_1000_per_s', kind=k, size=z) or 0:,.0f}/s, "
                                                 f"{one(lat, 'steady_after_us', kind=k, size=z) or 0:.0f} us" for k in KINDS) + " |"
               for z in sorted({r["size"] for r in lat})]
        md.append("")
    cold = s.get("cold_start", {}).get("rows", [])
    if cold:
        md += [f"## Cold start: {cfg['cold_iters']:,} round trips of 64 B from the first", "",
               "| kind | round trips/s (median) |", "|---|---|"]
        md += [f"| {LABEL[k]} | {median([r.get('round_trips_per_s') for r in pick(cold, kind=k)]) or 0:,.0f} |" for k in KINDS]
        md.append("")
    st = s.get("stream", {}).get("rows", [])
    if st:
        md += ["## Throughput: one-way stream", "", "GB/s:", "", sweep_table(st, "bytes_per_s", lambda v: f"{v / 1e9:.2f}"), "",
               "CPU (user+sys, both processes) per GB:", "", sweep_table(st, "cpu_s_per_gb", lambda v: f"{v:.2f} s"), "",
               "Message rate (messages/s):", "",
               sweep_table([r for r in st if r["size"] <= max(cfg["msgrate_sizes"])], "msgs_per_s", lambda v: f"{v:,.0f}"), ""]
    pc = s.get("paced", {}).get("rows", [])
    if pc:
        md += ["## Paced 64 KiB stream (achieved / target)", "", "| kind | " + " | ".join(f"{f:.0%}" for f in cfg["paced_fractions"]) + " |",
               "|---" * (len(cfg["paced_fractions"]) + 1) + "|"]
        for k in KINDS:
            cells = []
            for f in cfg["paced_fractions"]:
                got = [r["result"]["achieved_ratio"] for r in pc if r["kind"] == k and r["fraction"] == f and r.get("result")]
                cells.append(", ".join(f"{g:.1%}" for g in got) or "-")
            md.append(f"| {LABEL[k]} | " + " | ".join(cells) + " |")
        md.append("")
    conn = s.get("connections", {}).get("rows", [])
    if conn:
        md += ["## Connections: connect + one 64 B exchange + close", "", "| kind | connections/s (median) | vs TCP |", "|---|---|---|"]
        for k in ["tcp", "unix", "preload", "preload-every"]:
            v = median([r.get("connections_per_s") for r in pick(conn, kind=k)])
            md.append(f"| {LABEL[k]} | {v or 0:,.0f} | {paired_median(conn, 'connections_per_s', k, 'tcp') or 0:.2f}x |")
        md += ["| rdmashim core API | - (rdmaPingPong has no connection mode) | - |", ""]
    busy = s.get("busy", {}).get("rows", [])
    if busy:
        combos = sorted({(r["hogs"], r["pairs"]) for r in busy})
        md += ["## Busy machine: 64 B ping-pong pairs at once (total round trips/s)", "",
               "| pairs | hogs | " + " | ".join(LABEL[k] for k in KINDS) + " | rdmashim / TCP |", "|---" * (len(KINDS) + 3) + "|"]
        for h, p in combos:
            vals = [one(busy, "round_trips_per_s", kind=k, pairs=p, hogs=h) for k in KINDS]
            q = ratio(vals[2], vals[0])
            md.append(f"| {p} | {h} | " + " | ".join("-" if v is None else f"{v:,.0f}" for v in vals) + f" | {q or 0:.2f}x |")
        md.append("")
    mem, fds = s.get("memory", {}).get("rows", []), s.get("descriptors", {}).get("rows", [])
    if mem or fds:
        md += ["## Memory and descriptors", "", "| figure | TCP | Unix socket | rdmashim |", "|---|---|---|---|",
               f"| idle connection after {fmt_size(cfg['memory_bytes'])} (bytes held) | " +
               " | ".join(str(one(mem, "idle_conn_bytes", kind=k)) for k in ("tcp", "unix", "preload")) + " |"]
        for side in ("client", "server"):
            md.append(f"| descriptors with {cfg['hold']} connections open, {side} (all / below 1024) | "
                      f"{one(fds, side + '_fds', kind='tcp')} / {one(fds, side + '_low_fds', kind='tcp')} | - | "
                      f"{one(fds, side + '_fds', kind='preload')} / {one(fds, side + '_low_fds', kind='preload')} |")
        md.append("")
    sc = s.get("scale", {}).get("rows", [])
    if sc:
        n = cfg["scale"]
        md += [f"## Scale: {n:,} connections open at once, one client process, one server process", "",
               f"`tcpPingPong --hold N --then M --busy {cfg['scale_busy_conns']}`, soft RLIMIT_NOFILE raised to N + 1,024 "
               f"(what the program needs, as its user would raise it), the hard limit as this machine has it "
               f"({one(sc, 'nofile_limit', kind='tcp')}; systemd's default is 524,288), above the soft one rdmashim's "
               f"own descriptors go while there is room; one exchange each, then idle; then {cfg['scale_busy_conns']} busy "
               f"connections at once beside them (`--busy {cfg['scale_busy_conns']}`, a thread each on both sides) make "
               f"{cfg['scale_busy']:,} round trips of 64 B each: their total rate and the p99 of all their round trips, "
               "against the same beside 1 idle one.", "",
               "| kind | idle | upgraded to shm (both sides) | client fds | server fds | client RSS | server RSS | busy RT/s (total) | busy p99 |",
               "|---|---|---|---|---|---|---|---|---|"]
        for idle in (n, 1):
            for k in ("tcp", "preload"):
                r = pick(sc, kind=k, idle=idle)
                if not r:
                    md.append(f"| {LABEL[k]} | {idle:,} | failed | | | | | | |")
                    continue
                r = r[0]
                up = f"{r.get('shm_sides', 0) // 2:,} of {idle + cfg['scale_busy_conns']:,}" if k == "preload" else "-"
                md.append(f"| {LABEL[k]} | {idle:,} | {up} | {r.get('client_fds', 0):,} | {r.get('server_fds', 0):,} | "
                          f"{r.get('client_rss_kb', 0) / 1024:.1f} MiB | {r.get('server_rss_kb', 0) / 1024:.1f} MiB | "
                          f"{r.get('then_round_trips_per_s', 0):,.0f} | {r.get('then_p99_us', 0):.1f} us |")
        t_, p_ = (pick(sc, kind=k, idle=n) for k in ("tcp", "preload"))
        t1, p1 = (pick(sc, kind=k, idle=1) for k in ("tcp", "preload"))
        if t_ and p_:
            t_, p_ = t_[0], p_[0]
            # the idle ones upgraded (the busy ones, counted in shm_sides when they took shm, came after the counts)
            up = max(1, p_.get("shm_sides", 0) // 2 - p_.get("then_client_shm", 0))
            alone = lambda r: f"{r[0].get('then_p99_us', 0):.1f} us" if r else "failed"
            per = lambda f: (p_.get(f, 0) - t_.get(f, 0)) / up
            md += ["", f"Per upgraded idle connection ({up:,} of {n:,}; the descriptor budget keeps the rest on TCP "
                       f"under the hard limit), rdmashim minus TCP: client {per('client_fds'):+.2f} fds, "
                       f"{per('client_rss_kb'):+.1f} KiB resident; server {per('server_fds'):+.2f} fds, "
                       f"{per('server_rss_kb'):+.1f} KiB (resident counts the ring pages touched). The "
                       f"{cfg['scale_busy_conns']} busy connections' p99 beside {n:,} idle: TCP {t_.get('then_p99_us', 0):.1f} us, "
                       f"rdmashim {p_.get('then_p99_us', 0):.1f} us ({p_.get('then_client_shm', 0)} of {cfg['scale_busy_conns']} on shm"
                       f"{'' if p_.get('then_client_shm', 0) == cfg['scale_busy_conns'] else ', the rest kept on TCP by the descriptor budget'}"
                       "); beside 1 idle: "
                       f"TCP {alone(t1)}, rdmashim {alone(p1)}."]
        md.append("")
    mi = s.get("micro", {}).get("rows", [])
    if mi:
        md += ["## Micro-benchmarks of the ring (`bench/micro/ring_bench`, Google Benchmark, fake link, one thread)", "",
               "| benchmark | ns per op (CPU) | GB/s |", "|---|---|---|"]
        md += [f"| {r['name']} | {r['result']['cpu_ns']:.1f} | {r['result']['bytes_per_s'] / 1e9:.2f} |" for r in mi]
        md.append("")
    srv = s.get("servers", {})
    md += ["## Servers (`bench/servers`)", ""]
    if srv.get("rows"):
        md += ["| workload | TCP tx/s | CPU us/tx | rdmashim tx/s | CPU us/tx | ratio | bg | connections on shm | "
               "bench/servers' own verdict |",
               "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['workload']} | {r['tcp_tx_per_s']:,.0f} | {r['tcp_cpu_us_per_tx']:.1f} | {r['preload_tx_per_s']:,.0f} | "
               f"{r['preload_cpu_us_per_tx']:.1f} | {r['ratio']:.2f}x | {r['bg']} | {r['shm_conns']:,} of {r['conns']:,} | "
               f"{r['verdict']} |" for r in srv["rows"]]
        if any("no keep-alive" in r["workload"] for r in srv["rows"]):
            md += ["", "Without keep-alive every request is a new connection: rdmashim keeps a destination's repeated "
                   "short connections on TCP on purpose (core/discovery/short_lived.h), so those rows measure TCP "
                   "with rdmashim loaded, and \"connections on shm\" says how few upgraded."]
    else:
        md.append(f"Not measured: {srv.get('skipped_reason') or srv.get('error') or 'no rows'}.")
    vb = s.get("verbs", {})
    if vb.get("rows"):
        md += ["## Verbs (`bench/softroce.sh`: Soft-RoCE in qemu guests, TCG)", "",
               "64 B ping-pong in one guest (two processes), then between two guests; every row of a table in the same boot. "
               "`1guest:shim` and `2guests:shim` are the unmodified tcpPingPong under rdmashim on verbs; `2guests:auto` is it "
               "left to auto, which keeps software RDMA across hosts on TCP.", "",
               "| row | what | round trips/s | p50 us | p99 us | vs TCP |", "|---|---|---|---|---|---|"]
        base = {k.split(":")[0]: r["result"]["round_trips_per_s"] for r in vb["rows"]
                for k in [r["kind"]] if k.endswith(":tcp") and r.get("result")}
        for r in vb["rows"]:
            x = r.get("result")
            if x:
                b = base.get(r["kind"].split(":")[0])
                vs = f"{x['round_trips_per_s'] / b:.2f}x" if b else "-"
                md.append(f"| {r['kind']} | {r['what'].replace(' [1]', '')} | {x['round_trips_per_s']:,.0f} | {x.get('p50_us', 0):.1f} | "
                          f"{x.get('p99_us', 0):.1f} | {vs} |")
            else:
                md.append(f"| {r['kind']} | {r['what']} | failed: {r.get('error') or '?'} | | | |")
        loads = "; ".join(f"{k} {v['host_load'][0]} -> {v['host_load'][1]}" for k, v in vb.get("tables", {}).items()
                          if len(v.get("host_load", [])) == 2)
        md += ["", f"`ib_write_lat` reports one-way times, doubled here. Host load average (1 min) before -> after each "
               f"boot: {loads}.", ""]
    md += ["", "## Not in this suite yet", ""]
    md += [f"- {name}: {s[name]['skipped_reason']}" for name in ("scale", "micro") if s.get(name, {}).get("skipped_reason")]
    md += ["- verbs: the file-transfer table between two Soft-RoCE guests is bench/softroce_cat.sh, linked here, not run"]
    if vb.get("skipped_reason") or vb.get("error"):
        md.append(f"- verbs ping-pong tables: {vb.get('skipped_reason') or vb.get('error')}")
    if made:
        md += ["", "## Plots", ""] + [f"![{cap}]({f})" for f, cap in made]
    if res["errors"]:
        md += ["", "## Runs that failed", ""] + [f"- `{w}`: {e}" for w, e in res["errors"]]
    return "\n".join(md) + "\n"
