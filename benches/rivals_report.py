#!/usr/bin/env python3
"""rivals_report.py manifest DIR OUT.json
rivals_report.py diff BEFORE.json AFTER.json DETAILS.txt
rivals_report.py report STEPS.jsonl OUT.json
rivals_report.py --table RESULTS.json

Helpers of benches/rivals.sh:

manifest  every entry under DIR (not following symlinks): for regular files
          SHA-256, size, mode, owner, mtime, ctime, inode, link count and a
          digest of the extended attributes; for directories and symlinks
          their type, mode, mtime (and the link target).
diff      compares two manifests; prints one KEY=VALUE per line (counts of
          files whose content, size, mode, owner, mtime, inode, ... changed,
          entries missing or new) for rivals.sh's record, and writes the
          paths, one line per change, to DETAILS.txt.
report    turns the raw records into one JSON document (OUT.json) and prints
          the Markdown tables (one per filesystem, a row per tool, ratios
          against dedupscan); --table prints them again from OUT.json.
"""
import hashlib
import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def xattr_digest(path):
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return None
    if not names:
        return ""
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode() + b"\0")
        try:
            h.update(os.getxattr(path, n, follow_symlinks=False))
        except OSError:
            h.update(b"?")
        h.update(b"\0")
    return h.hexdigest()[:16]


def manifest(root, out):
    entries = {}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            e = {"mode": st.st_mode, "mtime_ns": st.st_mtime_ns}
            if stat.S_ISREG(st.st_mode):
                e.update(type="f", size=st.st_size, uid=st.st_uid, gid=st.st_gid, ctime_ns=st.st_ctime_ns,
                         ino=st.st_ino, nlink=st.st_nlink, xattrs=xattr_digest(p))
                files.append(rel)
            elif stat.S_ISDIR(st.st_mode):
                e["type"] = "d"
            elif stat.S_ISLNK(st.st_mode):
                e.update(type="l", target=os.readlink(p))
            else:
                e["type"] = "o"
            entries[rel] = e
    # hashlib releases the GIL: a few readers at once.
    with ThreadPoolExecutor(4) as pool:
        for rel, digest in zip(files, pool.map(lambda r: sha256(os.path.join(root, r)), files)):
            entries[rel]["sha256"] = digest
    with open(out, "w") as f:
        json.dump(entries, f, sort_keys=True)


# What diff counts: key in the records -> the fields compared (regular files).
FILE_FIELDS = {
    "content_changed": ("sha256",),
    "size_changed": ("size",),
    "mode_changed": ("mode",),
    "owner_changed": ("uid", "gid"),
    "mtime_changed": ("mtime_ns",),
    "xattrs_changed": ("xattrs",),
    "inode_changed": ("ino",),
    "nlink_changed": ("nlink",),
    "ctime_changed": ("ctime_ns",),
}


def diff(before_path, after_path, details_path):
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    counts = {k: 0 for k in FILE_FIELDS}
    counts.update(missing=0, new=0, type_changed=0, dir_mtime_changed=0, link_changed=0)
    lines = []
    for rel in sorted(set(before) | set(after)):
        b, a = before.get(rel), after.get(rel)
        if a is None:
            counts["missing"] += 1
            lines.append(f"missing\t{rel}")
            continue
        if b is None:
            counts["new"] += 1
            lines.append(f"new\t{rel}")
            continue
        if a["type"] != b["type"]:
            counts["type_changed"] += 1
            lines.append(f"type_changed\t{rel}\t{b['type']} -> {a['type']}")
            continue
        if a["type"] == "f":
            for key, fields in FILE_FIELDS.items():
                if any(a.get(x) != b.get(x) for x in fields):
                    counts[key] += 1
                    lines.append(f"{key}\t{rel}\t" + " ".join(f"{x}: {b.get(x)} -> {a.get(x)}" for x in fields))
        elif a["type"] == "d":
            if a["mtime_ns"] != b["mtime_ns"] or a["mode"] != b["mode"]:
                counts["dir_mtime_changed"] += 1
                lines.append(f"dir_mtime_changed\t{rel}")
        elif a != b:
            counts["link_changed"] += 1
            lines.append(f"link_changed\t{rel}")
    with open(details_path, "w") as f:
        f.write("\n".join(lines) + ("\n" if lines else ""))
    # The promise: every file's bytes, size, mode, owner and mtime are as
    # they were, and no entry appeared or disappeared. Inode numbers, link
    # counts and ctimes are reported, not part of the verdict.
    bad = ("content_changed", "size_changed", "mode_changed", "owner_changed", "mtime_changed", "xattrs_changed",
           "missing", "new", "type_changed", "link_changed")
    counts["content_unchanged"] = int(counts["content_changed"] == 0 and counts["size_changed"] == 0
                                      and counts["missing"] == 0 and counts["type_changed"] == 0)
    counts["metadata_unchanged"] = int(all(counts[k] == 0 for k in bad))
    counts["files_checked"] = sum(1 for e in before.values() if e["type"] == "f")
    for k, v in counts.items():
        print(f"{k}={v}")


# --- the report ---------------------------------------------------------------------

TOOLS = ["dedupscan", "duperemove", "jdupes", "rmlint", "fclones"]


def load_steps(path):
    meta, fss = {}, {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            step = rec.pop("step")
            fs = rec.pop("fs", None)
            if fs is None:
                meta.update(rec)
                continue
            fss.setdefault(fs, {}).setdefault(step, {}).update(rec)
    return meta, fss


def derive(fss, meta):
    """fs -> {"corpus", "tools": {tool: summary}, "steps"}."""
    out = {}
    for fs, steps in fss.items():
        corpus = steps.get("corpus", {})
        ideal = corpus.get("ideal_dup_block_bytes_4k")
        ideal_file = corpus.get("ideal_dup_file_bytes")
        tools = {}
        for tool in meta.get("tools", "").split(","):
            t = dict(steps.get(f"tool:{tool}", {}))
            if not t:
                continue
            if not t.get("skipped"):
                names = t.get("steps", "").split()
                parts = [steps.get(f"{tool}_{n}", {}) for n in names]
                t["wall_s"] = round(sum(p.get("wall_s", 0) for p in parts), 3)
                t["max_rss_kb"] = max((p.get("max_rss_kb", 0) for p in parts), default=0)
                rcs = [p.get("rc") for p in parts]
                t["rc"] = next((rc for rc in rcs if rc not in (0, None)), 0)
                t["step_wall_s"] = {n: p.get("wall_s") for n, p in zip(names, parts)}
                t["step_rc"] = {n: p.get("rc") for n, p in zip(names, parts)}
                t["freed_over_ideal"] = None if not ideal else t.get("freed", 0) / ideal
                t["freed_over_ideal_whole_file"] = None if not ideal_file else t.get("freed", 0) / ideal_file
            tools[tool] = t
        ds = tools.get("dedupscan", {})
        for t in tools.values():
            if t.get("skipped"):
                continue
            t["wall_over_dedupscan"] = t["wall_s"] / ds["wall_s"] if ds.get("wall_s") else None
            t["rss_over_dedupscan"] = (t["max_rss_kb"] / ds["max_rss_kb"]) if ds.get("max_rss_kb") else None
            t["freed_over_dedupscan"] = (t.get("freed", 0) / ds["freed"]) if ds.get("freed") else None
        out[fs] = {"corpus": corpus, "tools": tools, "steps": steps}
    return out


def mib(n):
    return "–" if n is None else f"{n / 2**20:,.1f} MiB"


def x(r):
    return "–" if r is None else f"{r:.2f}×"


def pct(r):
    return "–" if r is None else f"{100 * r:.1f}%"


def metadata_cell(t):
    if t.get("content_unchanged") is None:
        return "not checked"
    if not t.get("content_unchanged"):
        return f"**CONTENT CHANGED** ({t.get('content_changed')} files)"
    notes = []
    for key, label in (("mtime_changed", "mtime"), ("mode_changed", "mode"), ("owner_changed", "owner"),
                       ("xattrs_changed", "xattrs"), ("inode_changed", "inode"), ("nlink_changed", "links"),
                       ("ctime_changed", "ctime"), ("dir_mtime_changed", "dir mtime"), ("new", "new entries"),
                       ("missing", "missing entries"), ("type_changed", "type"), ("link_changed", "symlinks")):
        if t.get(key):
            notes.append(f"{label} {t[key]:,}")
    verdict = "yes" if t.get("metadata_unchanged") else "**NO**"
    return verdict + (f" (changed: {', '.join(notes)})" if notes else "")


def table(meta, derived):
    lines = []
    for fs, d in derived.items():
        c = d["corpus"]
        lines.append("")
        lines.append(f"**{fs}** — corpus {c.get('files', 0):,} files, {mib(c.get('logical_bytes'))} logical, "
                     f"{mib(c.get('allocated_bytes'))} allocated; ideal duplicate {mib(c.get('ideal_dup_block_bytes_4k'))} "
                     f"(4 KiB blocks), of which whole files {mib(c.get('ideal_dup_file_bytes'))}")
        lines.append("")
        lines.append("| tool | wall (steps) | time / dedupscan | peak RSS | state file | freed (statfs) "
                     "| **freed / ideal** | freed / whole-file ideal | exit | bytes, size, mode, owner, mtime unchanged |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        order = meta.get("tools", "").split(",")
        for tool, t in sorted(d["tools"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
            if t.get("skipped"):
                lines.append(f"| {tool} | skipped: {t.get('reason', '')} |  |  |  |  |  |  |  |  |")
                continue
            wall = f"{t['wall_s']:.2f} s"
            if len(t.get("step_wall_s", {})) > 1:
                wall += " (" + " + ".join(f"{n} {w:.2f}" for n, w in t["step_wall_s"].items()) + ")"
            rc = ",".join(str(v) for v in t.get("step_rc", {}).values())
            state = "none" if t.get("state_bytes") is None else mib(t["state_bytes"])
            if t.get("state_what"):
                state += f" ({t['state_what']})"
            lines.append(f"| {tool} {t.get('version', '')} | {wall} | {x(t.get('wall_over_dedupscan'))} "
                         f"| {t['max_rss_kb'] / 1024:,.0f} MiB | {state} | {mib(t.get('freed'))} "
                         f"| {pct(t.get('freed_over_ideal'))} | {pct(t.get('freed_over_ideal_whole_file'))} "
                         f"| {rc} | {metadata_cell(t)} |")
    loads = [v.get("load1") for d in derived.values() for v in d["steps"].values() if v.get("load1") is not None]
    lines.append("")
    lines.append(f"Run {meta.get('started')} – {meta.get('finished')} ({meta.get('total_s')} s), corpus "
                 f"{meta.get('size_name')} ({mib(meta.get('size_bytes'))}), {meta.get('nproc')} CPUs "
                 f"({meta.get('cpu')}), {int(meta.get('mem_kb', 0)) // 1024} MiB RAM, kernel {meta.get('kernel')}; "
                 f"{meta.get('dedupscan_version')} (git {meta.get('git_head')}, {meta.get('git_dirty_files')} files "
                 f"modified); 1-min load average before the timed steps {min(loads, default=0):.2f}–"
                 f"{max(loads, default=0):.2f}.")
    return "\n".join(lines)


def report(steps_path, out_path):
    meta, fss = load_steps(steps_path)
    derived = derive(fss, meta)
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "filesystems": derived}, f, indent=2, sort_keys=True)
        f.write("\n")
    print(table(meta, derived))


def main(argv):
    if len(argv) == 3 and argv[0] == "manifest":
        manifest(argv[1], argv[2])
    elif len(argv) == 4 and argv[0] == "diff":
        diff(argv[1], argv[2], argv[3])
    elif len(argv) == 3 and argv[0] == "report":
        report(argv[1], argv[2])
    elif len(argv) == 2 and argv[0] == "--table":
        with open(argv[1]) as f:
            saved = json.load(f)
        print(table(saved["meta"], saved["filesystems"]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
