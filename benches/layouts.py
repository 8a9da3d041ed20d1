#!/usr/bin/env python3
"""benches/layouts.py OUT [SRC] — a corpus laid out unlike FULL's (about 1.9 GB,
seeded): backup generations of a tree (5 days, 3% of files appended to,
rewritten in place or deleted a day, new files), rotated logs (each .1 a prefix
of the live log, .2 of .1, lengths not block-aligned), a database whose pages
repeat inside itself plus a backup of it with scattered single-block changes,
layers (the same data behind a 12 KiB header, and with a block inserted every
16 MiB), one file in 41 copies, two files sharing every other block, and
small files sharing one template block, larger ones a resource inside;
and (H) a file whose blocks are another's reordered, one payload at a
different offset in each of 12 containers, small files made of blocks from
a vocabulary of 64, and copies truncated at unaligned lengths.
SRC: the tree the backups copy (half its files, by a seeded pick); default the
bench cache's Debian tree, else /usr/share."""
import os, random, sys
out = sys.argv[1]; R = random.Random(7); B = 4096
cache = '/var/tmp/dedupscan-bench-cache/trees/debian-bookworm/usr'
src = sys.argv[2] if len(sys.argv) > 2 else (cache if os.path.isdir(cache) else '/usr/share')
def rnd(n): return R.randbytes(n)
def w(p, data):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'wb') as f: f.write(data)
# A. backup generations (5 days), ~3% of files changed a day
files = []
for d, _, fs in os.walk(src):
    for n in fs:
        p = os.path.join(d, n)
        if os.path.isfile(p) and not os.path.islink(p) and os.access(p, os.R_OK): files.append(os.path.relpath(p, src))
files.sort(); R.shuffle(files); files = sorted(files[:len(files)//2])
cur = {}
for rel in files:
    with open(os.path.join(src, rel), 'rb') as f: cur[rel] = f.read()
for day in range(5):
    if day:
        for rel in R.sample(sorted(cur), len(cur)*3//100):
            v = cur[rel]; k = R.random()
            if k < 0.5: cur[rel] = v + rnd(R.randint(10, 20000))
            elif k < 0.75 and len(v) > 2*B:
                o = R.randrange(0, len(v)-B); cur[rel] = v[:o] + rnd(100) + v[o+100:]
            else: del cur[rel]
        for i in range(30): cur[f'new/d{day}-{i}'] = rnd(R.randint(1000, 300000))
    for rel, v in cur.items(): w(f'{out}/backup/day{day}/{rel}', v)
# B. rotated logs: .1 is a prefix of the live log, .2 a prefix of .1
for i in range(20):
    n = R.randint(2<<20, 14<<20)
    base = b''.join(b'%08d host app[%d]: request %x done in %d ms\n' % (j, i, R.getrandbits(48), R.randint(1, 999)) for j in range(n // 50))
    w(f'{out}/logs/app{i}.log', base)
    w(f'{out}/logs/app{i}.log.1', base[:R.randint(len(base)//2, len(base)-1)])
    w(f'{out}/logs/app{i}.log.2', base[:R.randint(len(base)//4, len(base)//2)])
# C. a database with repeated pages inside itself, and a backup of it with scattered single-block changes
pages = []
for i in range(128 << 20 >> 12):
    pages.append(R.choice(pages) if pages and R.random() < 0.3 else rnd(B))
db = b''.join(pages); w(f'{out}/db/main.db', db)
bk = bytearray(db)
for i in R.sample(range(len(pages)), len(pages)//10): bk[i*B:(i+1)*B] = rnd(B)
w(f'{out}/db/main.db.bak', bytes(bk))
# D. layers: the same data behind a header, and with a block inserted every 16 MiB
x = rnd(64 << 20); w(f'{out}/layers/x.bin', x)
w(f'{out}/layers/y.bin', rnd(12288) + x + rnd(5000))
z = b''.join(rnd(B) + x[o:o + (16 << 20)] for o in range(0, len(x), 16 << 20)); w(f'{out}/layers/z.bin', z)
# E. one file, 40 copies
e = rnd(16 << 20)
for i in range(41): w(f'{out}/many/c{i % 7}/copy{i}.bin', e)
# F. two files sharing every other block at the same offset
a = bytearray(rnd(64 << 20)); b = bytearray(a)
for i in range(0, len(a) // B, 2): b[i*B:(i+1)*B] = rnd(B)
w(f'{out}/scatter/a.bin', bytes(a)); w(f'{out}/scatter/b.bin', bytes(b))
# G. shared parts smaller than the rest of their file: small documents made
# from 4 templates (a common first block) or ending in one of 4 footers, and
# 1-4 MiB files sharing a resource (a quarter of them) somewhere inside
hdr = [rnd(B) for _ in range(4)]; ftr = [rnd(B) for _ in range(4)]
for i in range(2000):
    w(f'{out}/templates/doc/{i % 40}/d{i}.odt', hdr[i % 4] + rnd(R.choice((2, 3, 5)) * B))
    w(f'{out}/templates/mail/{i % 40}/m{i}.eml', rnd(R.choice((2, 3, 5)) * B) + ftr[i % 4])
for i in range(48):
    res = rnd(R.choice((256, 512, 1024)) << 10)
    for side in range(2):
        n = len(res) * 3; o = R.randrange(0, n // B) * B
        body = rnd(n)
        w(f'{out}/templates/res/{side}/r{i}.bin', body[:o] + res + body[o:])
# H. shapes of no other part (own seed: parts A-G stay byte for byte as they
# were): a 64 MiB file and its blocks in runs of 1-8 reordered; an 8 MiB
# payload at a different 4 KiB-aligned offset in each of 12 containers;
# 3,000 files of 2-10 blocks drawn from a vocabulary of 64; a 24 MiB file
# and 5 copies of it truncated at unaligned lengths
H = random.Random(11)
a = H.randbytes(64 << 20); w(f'{out}/reordered/a.bin', a)
runs, i = [], 0
while i < len(a):
    n = H.randint(1, 8) * B; runs.append(a[i:i + n]); i += n
H.shuffle(runs); w(f'{out}/reordered/b.bin', b''.join(runs))
pay = H.randbytes(8 << 20)
for k in range(12):
    w(f'{out}/containers/c{k}.img', H.randbytes(H.randint(0, 2048) * B) + pay + H.randbytes(H.randint(0, 512) * B))
vocab = [H.randbytes(B) for _ in range(64)]
for k in range(3000):
    w(f'{out}/vocab/{k % 50}/f{k}.dat', b''.join(H.choice(vocab) for _ in range(H.randint(2, 10))))
t = H.randbytes(24 << 20); w(f'{out}/truncated/t.bin', t)
for k in range(5): w(f'{out}/truncated/t{k}.bin', t[:H.randint(8 << 20, (24 << 20) - 1)])
