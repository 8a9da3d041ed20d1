#!/usr/bin/env python3
"""benches/sysfiles.py OUT [SEED] — a fourth corpus, of real files: this
machine's own libraries, Python and documentation (/usr; about 2.6 GB on a
Debian 12 build machine, 13,000 files and 1,100 symlinks), unlike the random
data of farm.py and layouts.py. Laid out as an administrator finds them:

- sys/: the files as installed (lib/, py/, doc/);
- copy/: another copy of lib/'s entries under renamed directories (a
  number before each name, so the walk meets them in another order) and of
  py/, an eighth of the files over 20 KB edited (one byte flipped, 7 bytes
  inserted in the middle so the second half shifts, data appended, or 4,200
  bytes put in front: nothing of those to share at 4 KiB);
- tar/: uncompressed tarballs of py/ and doc/ (512-byte aligned members:
  only those that fall on 4 KiB boundaries can be shared);
- img/: ext4 images holding lib/ and doc/ (mkfs.ext4 -d: 4 KiB blocks, the
  files' data block-aligned inside them).

The data depends on the machine's packages, so compare runs made on one
machine, in one session. Needs tar and mkfs.ext4 (e2fsprogs). Run it with
`benches/layouts.sh --corpus OUT`."""
import glob
import os
import random
import shutil
import subprocess
import sys

root, seed = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
R = random.Random(seed)
SOURCES = {'lib': '/usr/lib/x86_64-linux-gnu', 'py': sorted(glob.glob('/usr/lib/python3.[0-9]*'))[-1],
           'doc': '/usr/share/doc'}
shutil.rmtree(root, ignore_errors=True)
os.makedirs(root)
os.makedirs(f'{root}/sys')


def cp(src, dst):
    """cp -a: hard links (the DRI drivers are one file under many names),
    holes, modes and times kept."""
    subprocess.run(['cp', '-a', src, dst], check=True)


for name, src in SOURCES.items():
    cp(src, f'{root}/sys/{name}')

# The renamed copy: lib's entries, each behind a number, and py whole.
lib = f'{root}/sys/lib'
for i, entry in enumerate(sorted(os.listdir(lib))):
    os.makedirs(f'{root}/copy', exist_ok=True)
    cp(f'{lib}/{entry}', f'{root}/copy/c{(i * 7919) % 1000:03}-{entry}')
cp(f'{root}/sys/py', f'{root}/copy/python')
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(f'{root}/copy') for f in fs)
files = [p for p in files if not os.path.islink(p) and os.path.getsize(p) > 20000]
for p in R.sample(files, len(files) // 8):
    with open(p, 'rb') as f:
        b = bytearray(f.read())
    kind = R.randrange(4)
    if kind == 0:
        b[R.randrange(len(b))] ^= 0xff
    elif kind == 1:
        b = b[:len(b) // 2] + b'PATCHED' + b[len(b) // 2:]
    elif kind == 2:
        b += b'appended\n' * 100
    else:
        b = b'#!hdr\n' * 700 + b
    with open(p, 'wb') as f:
        f.write(b)

os.makedirs(f'{root}/tar')
for part in ('py', 'doc'):
    subprocess.run(['tar', '-C', f'{root}/sys', '-cf', f'{root}/tar/{part}.tar', part], check=True)
os.makedirs(f'{root}/img')
for part in ('lib', 'doc'):
    used = sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(f'{root}/sys/{part}') for f in fs)
    img = f'{root}/img/{part}.ext4'
    with open(img, 'wb') as f:
        f.truncate(used * 5 // 4 + (64 << 20))
    subprocess.run(['mkfs.ext4', '-q', '-F', '-b', '4096', '-d', f'{root}/sys/{part}', img], check=True)
