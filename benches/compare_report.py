#!/usr/bin/env python3
"""compare_report.py STEPS.jsonl LOGDIR OUT.json
compare_report.py --table RESULTS.json

Turns the raw records of benches/compare.sh into one JSON document (OUT.json)
and a Markdown table on stdout. Every ratio in the table is computed here from
the raw numbers, which are all kept in the JSON. With --table, prints the
table again from a results file written earlier.
"""
import json
import os
import sys

if len(sys.argv) == 3 and sys.argv[1] == "--table":
    with open(sys.argv[2]) as f:
        saved = json.load(f)
    steps_path = logdir = out_path = None
elif len(sys.argv) == 4:
    saved = None
    steps_path, logdir, out_path = sys.argv[1:4]
else:
    sys.exit(__doc__)

meta = {}
fss = {}  # fs -> step -> merged record
for line in open(steps_path) if saved is None else []:
    rec = json.loads(line)
    step = rec.pop("step")
    fs = rec.pop("fs", None)
    if fs is None:
        meta.update(rec)
        continue
    fss.setdefault(fs, {}).setdefault(step, {}).update(rec)

if saved is not None:
    meta = saved["meta"]
    fss = {fs: v["steps"] for fs, v in saved["filesystems"].items()}

# dedupscan's own JSON reports.
for fs, steps in fss.items() if saved is None else []:
    for name, rec in steps.items():
        if name.startswith("ds_"):
            try:
                with open(os.path.join(logdir, f"{fs}-{name}.out")) as f:
                    rec["report"] = json.load(f)
            except (OSError, ValueError):
                rec["report"] = None


def ratio(a, b):
    return None if a is None or not b else a / b


def get(steps, name, key, sub=None):
    rec = steps.get(name) or {}
    v = rec.get(key)
    if sub is not None:
        v = (v or {}).get(sub)
    return v


derived = {}
for fs, s in fss.items():
    d = {}
    raws = {k: v["wall_s"] for k, v in s.items() if k.startswith("raw_read_P") and v.get("rc") == 0}
    if raws:
        best = min(raws, key=raws.get)
        d["raw_read_best_s"] = raws[best]
        d["raw_read_best_parallelism"] = int(best[len("raw_read_P"):])
    raw = d.get("raw_read_best_s")
    corpus = s.get("corpus", {})
    ideal = corpus.get("ideal_dup_block_bytes_4k")
    logical = corpus.get("logical_bytes")
    find = get(s, "find_meta", "wall_s")
    d["scan_over_raw"] = ratio(get(s, "ds_scan", "wall_s"), raw)
    d["full_over_raw"] = ratio(get(s, "ds_run", "wall_s"), raw)
    d["duperemove_over_raw"] = ratio(get(s, "dupe", "wall_s"), raw)
    d["dedupscan_freed_over_ideal"] = ratio(get(s, "ds_run", "freed"), ideal)
    d["duperemove_freed_over_ideal"] = ratio(get(s, "dupe", "freed"), ideal)
    d["dedupscan_db_over_logical"] = ratio(get(s, "ds_run", "db_bytes"), logical)
    d["duperemove_hashfile_over_logical"] = ratio(get(s, "dupe", "db_bytes"), logical)
    d["incr_scan_over_find"] = ratio(get(s, "ds_scan_incr", "wall_s"), find)
    d["incr_run_over_find"] = ratio(get(s, "ds_run_incr", "wall_s"), find)
    d["duperemove_rerun_over_find"] = ratio(get(s, "dupe_rerun", "wall_s"), find)
    d["second_run_over_first"] = ratio(get(s, "ds_run2", "wall_s"), get(s, "ds_run", "wall_s"))
    d["incr_run_over_first"] = ratio(get(s, "ds_run_incr", "wall_s"), get(s, "ds_run", "wall_s"))
    # Issue 14: a rerun right after the dedupe reads <= 60% of what the
    # first run read (bytes_hashed counts bytes read, not those reused).
    d["rehash_read_over_first"] = ratio(get(s, "ds_rehash", "report", "bytes_hashed"),
                                        get(s, "ds_run", "report", "bytes_hashed"))
    d["raw_read_mib_s"] = ratio((corpus.get("allocated_bytes") or 0) / 2**20, raw)
    d["scan_hashed_mib_s"] = ratio((get(s, "ds_scan", "report", "bytes_hashed") or 0) / 2**20,
                                   get(s, "ds_scan", "wall_s"))
    run2_sub = get(s, "ds_run2", "report", "duplicate_bytes")
    incr_sub = get(s, "ds_run_incr", "report", "duplicate_bytes")
    # Issue 3: a no-change incremental run takes at most 2x a cold find.
    d["issue3_pass"] = d["incr_run_over_find"] is not None and d["incr_run_over_find"] <= 2.0
    # Issue 4: a second run on an unchanged volume submits nothing and takes
    # at most 10% of the first.
    d["issue4_pass"] = (
        run2_sub == 0 and d["second_run_over_first"] is not None and d["second_run_over_first"] <= 0.10
    )
    d["issue4_incremental_pass"] = (
        incr_sub == 0 and d["incr_run_over_first"] is not None and d["incr_run_over_first"] <= 0.10
    )
    d["issue14_rehash_pass"] = d["rehash_read_over_first"] is not None and d["rehash_read_over_first"] <= 0.6
    unchanged = [v.get("content_unchanged") for v in s.values() if "content_unchanged" in v]
    d["contents_verified"] = None if not unchanged else all(x == 1 for x in unchanged)
    derived[fs] = d

with open(out_path or os.devnull, "w") as f:
    json.dump({"meta": meta, "filesystems": {fs: {"steps": fss[fs], "derived": derived[fs]} for fs in fss}},
              f, indent=2, sort_keys=True)
    f.write("\n")

# --- the table ------------------------------------------------------------------


def mib(n):
    return "–" if n is None else f"{n / 2**20:,.1f} MiB"


def sec(x):
    return "–" if x is None else f"{x:.2f} s"


def x(r):
    return "–" if r is None else f"{r:.2f}×"


def pct(r):
    return "–" if r is None else f"{100 * r:.1f}%"


def rss(steps, name):
    v = get(steps, name, "max_rss_kb")
    return "–" if v is None else f"{v / 1024:,.0f} MiB"


def status(steps, name):
    rc = get(steps, name, "rc")
    return "" if rc in (0, None) else f" (exit {rc})"


cols = list(fss)
rows = []


def row(label, fn):
    rows.append([label] + [fn(fs, fss[fs], derived[fs]) for fs in cols])


def rep(s, name, key):
    return get(s, name, "report", key)


row("corpus: files / logical size", lambda fs, s, d: f"{s['corpus']['files']:,} / {mib(s['corpus']['logical_bytes'])}")
row("corpus: allocated", lambda fs, s, d: mib(s["corpus"].get("allocated_bytes")))
row("ideal duplicate (4 KiB blocks) / whole-file part",
    lambda fs, s, d: f"{mib(s['corpus'].get('ideal_dup_block_bytes_4k'))} / {mib(s['corpus'].get('ideal_dup_file_bytes'))}")
row("(1) cold raw read, fastest of P=4/16/64",
    lambda fs, s, d: f"{sec(d.get('raw_read_best_s'))} (P={d.get('raw_read_best_parallelism')}; "
    + ", ".join(f"{sec(get(s, f'raw_read_P{n}', 'wall_s'))}" for n in (4, 16, 64)) + ")")
row("    settle read of copies A / B / C (first read, in no ratio)",
    lambda fs, s, d: " / ".join(sec(get(s, f"settle_{c}", "wall_s")) for c in "ABC"))
row("    raw read throughput (allocated bytes)", lambda fs, s, d: "–" if d.get("raw_read_mib_s") is None else f"{d['raw_read_mib_s']:.0f} MiB/s")
row("(2) dedupscan scan", lambda fs, s, d: sec(get(s, "ds_scan", "wall_s")) + status(s, "ds_scan"))
row("    scan throughput (bytes hashed)", lambda fs, s, d: "–" if d.get("scan_hashed_mib_s") is None else f"{d['scan_hashed_mib_s']:.0f} MiB/s")
row("    scan / raw read", lambda fs, s, d: x(d["scan_over_raw"]))
row("(3) dedupscan full run", lambda fs, s, d: sec(get(s, "ds_run", "wall_s")) + status(s, "ds_run"))
row("    phases walk / hash / plan / share",
    lambda fs, s, d: " / ".join(sec((rep(s, "ds_run", "timings") or {}).get(k, 0) / 1000) for k in ("walk_ms", "hash_ms", "plan_ms", "dedupe_ms")))
row("    full run / raw read", lambda fs, s, d: x(d["full_over_raw"]))
row("    submitted / confirmed shared", lambda fs, s, d: f"{mib(rep(s, 'ds_run', 'duplicate_bytes'))} / {mib(rep(s, 'ds_run', 'deduped_bytes'))}")
row("    rewritten to free partly shared extents (btrfs)", lambda fs, s, d: mib(rep(s, "ds_run", "rewritten_bytes")))
row("    freed (statfs, after sync) / as dedupscan reports it",
    lambda fs, s, d: f"{mib(get(s, 'ds_run', 'freed'))} / {mib(rep(s, 'ds_run', 'freed_bytes'))}")
row("    **freed / ideal**", lambda fs, s, d: pct(d["dedupscan_freed_over_ideal"]))
row("    database size / logical bytes", lambda fs, s, d: f"{mib(get(s, 'ds_run', 'db_bytes'))} / {pct(d['dedupscan_db_over_logical'])}")
row("    peak RSS scan / full run", lambda fs, s, d: f"{rss(s, 'ds_scan')} / {rss(s, 'ds_run')}")
row("(4) duperemove -dr --hashfile", lambda fs, s, d: sec(get(s, "dupe", "wall_s")) + status(s, "dupe"))
row("    duperemove / raw read", lambda fs, s, d: x(d["duperemove_over_raw"]))
row("    freed (statfs, after sync)", lambda fs, s, d: mib(get(s, "dupe", "freed")))
row("    **freed / ideal**", lambda fs, s, d: pct(d["duperemove_freed_over_ideal"]))
row("    hashfile size / logical bytes", lambda fs, s, d: f"{mib(get(s, 'dupe', 'db_bytes'))} / {pct(d['duperemove_hashfile_over_logical'])}")
row("    peak RSS", lambda fs, s, d: rss(s, "dupe"))
row("(5) cold find -printf size/mtime/ctime/inode", lambda fs, s, d: sec(get(s, "find_meta", "wall_s")))
row("    dedupscan scan --incremental, no change", lambda fs, s, d: f"{sec(get(s, 'ds_scan_incr', 'wall_s'))}{status(s, 'ds_scan_incr')} ({x(d['incr_scan_over_find'])} find)")
row("    dedupscan --incremental, no change", lambda fs, s, d: f"{sec(get(s, 'ds_run_incr', 'wall_s'))}{status(s, 'ds_run_incr')} ({x(d['incr_run_over_find'])} find)")
row("    **incremental / find** (issue 3: ≤ 2×)", lambda fs, s, d: f"{x(d['incr_run_over_find'])} {'pass' if d['issue3_pass'] else 'FAIL'}")
row("    incremental run / first full run (issue 4 with --incremental: ≤ 10%)",
    lambda fs, s, d: f"{pct(d['incr_run_over_first'])} {'pass' if d['issue4_incremental_pass'] else 'FAIL'}")
row("    incremental run: submitted / freed",
    lambda fs, s, d: f"{mib(rep(s, 'ds_run_incr', 'duplicate_bytes'))} / {mib(get(s, 'ds_run_incr', 'freed'))}")
row("    duperemove --hashfile rerun", lambda fs, s, d: f"{sec(get(s, 'dupe_rerun', 'wall_s'))}{status(s, 'dupe_rerun')} ({x(d['duperemove_rerun_over_find'])} find), freed {mib(get(s, 'dupe_rerun', 'freed'))}")
row("(6) second full dedupscan run", lambda fs, s, d: sec(get(s, "ds_run2", "wall_s")) + status(s, "ds_run2"))
row("    **second / first** (issue 4: ≤ 10%, 0 submitted)",
    lambda fs, s, d: f"{pct(d['second_run_over_first'])}, submitted {mib(rep(s, 'ds_run2', 'duplicate_bytes'))} {'pass' if d['issue4_pass'] else 'FAIL'}")
row("(7) dedupscan --rehash after the dedupe", lambda fs, s, d: sec(get(s, "ds_rehash", "wall_s")) + status(s, "ds_rehash"))
row("    read / reused from shared extents",
    lambda fs, s, d: f"{mib(rep(s, 'ds_rehash', 'bytes_hashed'))} / {mib(rep(s, 'ds_rehash', 'bytes_reused'))}")
row("    **read / first run's read** (issue 14: ≤ 60%)",
    lambda fs, s, d: f"{pct(d['rehash_read_over_first'])} {'pass' if d['issue14_rehash_pass'] else 'FAIL'}")
row("file contents unchanged (SHA-256)", lambda fs, s, d: {True: "yes", False: "**NO**", None: "not checked"}[d["contents_verified"]])

print()
print("| step | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for r in rows:
    print("| " + " | ".join(r) + " |")
print()
m = meta
loads = [v.get("load1") for s in fss.values() for v in s.values() if v.get("load1") is not None]
if m.get("label"):
    print(f"{m['label']}.")
print(f"Run {m.get('started')} – {m.get('finished')} ({m.get('total_s')} s), corpus {m.get('size_name')} "
      f"({mib(m.get('size_bytes'))}), {m.get('nproc')} CPUs ({m.get('cpu')}), {int(m.get('mem_kb', 0)) // 1024} MiB RAM, "
      f"kernel {m.get('kernel')}; {m.get('dedupscan_version')} (git {m.get('git_head')}, "
      f"{m.get('git_dirty_files')} files modified), {m.get('duperemove_version')} {m.get('duperemove_args') or ''}; "
      f"1-min load average before the timed steps {min(loads, default=0):.2f}–{max(loads, default=0):.2f}.")
if m.get("memory_limit_bytes"):
    print(f"Every timed step ran in a memory cgroup limited to {mib(m['memory_limit_bytes'])} (`--memory-limit`).")
