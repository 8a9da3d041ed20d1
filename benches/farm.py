#!/usr/bin/env python3
"""benches/farm.py OUT [SEED] — a third corpus (about 1.7 GB, seeded), random
data laid out as on a build farm, unlike FULL (real trees, images, tarballs)
and layouts.py (backups, logs, databases): a tree of 2,500 files of 128 B to
3 MiB (t0) and an edited copy of it (t1: a tenth of the files with one block
rewritten in the middle, a tenth appended to, a tenth behind a 4 KiB header,
a twentieth behind 100 bytes (nothing to share at 4 KiB), a twentieth cut in
half); a log and two rotated prefixes of it; a container of 800 of t0's files,
each behind a header block and padded to 4 KiB; 20 sparse files holding a
file of t0 after a hole; 6,000 files under 9 KiB, a third of them copies.
With --text the data is words (compressible: for compress-force runs).
Run it with `benches/layouts.sh --corpus OUT`."""
import os
import random
import sys

args = [a for a in sys.argv[1:] if a != '--text']
root, seed = args[0], int(args[1]) if len(args) > 1 else 7
R = random.Random(seed)
B = 4096
if '--text' in sys.argv:
    WORDS = [R.randbytes(R.randrange(2, 9)).hex().encode() for _ in range(4000)]

    def rb(n):
        out = bytearray()
        while len(out) < n:
            out += R.choice(WORDS) + b' '
        return bytes(out[:n])
else:
    def rb(n): return R.randbytes(n)


def w(p, b):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'wb') as f:
        f.write(b)


names = [f"{R.choice(['src', 'lib', 'pkg', 'mod', 'obj'])}{i % 37}/{R.getrandbits(32):08x}."
         f"{R.choice(['o', 'so', 'a', 'js', 'bin'])}" for i in range(2500)]
base = {}
for n in names:
    base[n] = rb(int(2 ** R.uniform(7, 21.5)))
    w(f"{root}/t0/{n}", base[n])
for n in names:
    d, k = base[n], R.random()
    if k < 0.1 and len(d) > 3 * B:     # one block rewritten in the middle
        o = (len(d) // B // 2) * B
        d = d[:o] + rb(B) + d[o + B:]
    elif k < 0.2:                       # appended to
        d = d + rb(R.randrange(1, 64 * 1024))
    elif k < 0.3:                       # behind a 4 KiB header
        d = rb(B) + d
    elif k < 0.35:                      # behind 100 bytes: nothing to share at 4 KiB
        d = rb(100) + d
    elif k < 0.4 and len(d) > 2 * B:    # cut in half
        d = d[: len(d) // 2]
    w(f"{root}/t1/{n}", d)
log = rb(24 << 20)
w(f"{root}/var/log/app.log", log)
w(f"{root}/var/log/app.log.1", log[: 16 << 20])
w(f"{root}/var/log/app.log.2", log[: 9 << 20])
img = bytearray()
for n in R.sample(names, 800):
    img += rb(B) + base[n] + bytes((-len(base[n])) % B)
w(f"{root}/images/layer.img", bytes(img))
for j in range(20):
    n, p = R.choice(names), f"{root}/sparse/s{j}"
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'wb') as f:
        f.seek(R.randrange(1, 64) * B * 16)
        f.write(base[n])
        f.truncate(f.tell() + R.randrange(0, 8) * B)
tiny = [rb(R.randrange(1, 9000)) for _ in range(3000)]
for j in range(6000):
    w(f"{root}/tiny/d{j % 50}/f{j}", tiny[j % 3000] if j % 3 == 0 else rb(R.randrange(1, 9000)))
