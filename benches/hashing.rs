//! Block hashing throughput: `dedupscan::hash::hash_file` on a 64 MiB file
//! that sits in the page cache, so the number is CPU cost (SHA-256 per 4 KiB
//! block, the zero-block check and the `pread` copy),
//! not disk speed. Compare it with the cold raw-read speed that
//! `benches/compare.sh` measures: when hashing is slower than the disk, the
//! scan is CPU-bound.
//!
//! Cases:
//! - `random/4K`: incompressible data, default block size (the common case);
//! - `random/64K`: the same file with 64 KiB blocks (fewer digests, same bytes);
//! - `zeros/4K`: written zeros (every block takes the zero fast path);
//! - `sparse/4K`: a file that is mostly a hole (`SEEK_DATA` skips it; the
//!   throughput is per logical byte).
//!
//! Kept short (10 samples, ~5 s each) so that `cargo bench` stays under two
//! minutes on a 2-core machine. Run one group with
//! `cargo bench --bench hashing -- random`.

use std::fs::File;
use std::hint::black_box;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dedupscan::corpus::Rng;
use dedupscan::hash::hash_file;

const SIZE: u64 = 64 << 20;

/// A temporary file of `SIZE` bytes: `data` written at each offset of
/// `parts`, holes elsewhere. Read once so it is in the page cache.
fn make_file(dir: &tempfile::TempDir, name: &str, parts: &[(u64, &[u8])]) -> File {
    let path = dir.path().join(name);
    let mut f = File::options().create(true).truncate(true).read(true).write(true).open(path).unwrap();
    for (off, data) in parts {
        f.seek(SeekFrom::Start(*off)).unwrap();
        f.write_all(data).unwrap();
    }
    f.set_len(SIZE).unwrap();
    f.sync_all().unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut sink = Vec::with_capacity(SIZE as usize);
    f.read_to_end(&mut sink).unwrap();
    f
}

fn hashing(c: &mut Criterion) {
    // /var/tmp rather than /tmp: /tmp may be a small tmpfs.
    let dir = tempfile::Builder::new()
        .prefix("dedupscan-bench-hash")
        .tempdir_in(std::env::var_os("DEDUPSCAN_BENCH_TMP").unwrap_or_else(|| "/var/tmp".into()))
        .unwrap();
    let random = Rng::new(42).bytes(SIZE as usize);
    let zeros = vec![0u8; SIZE as usize];
    let island = Rng::new(43).bytes(1 << 20);
    let f_random = make_file(&dir, "random.bin", &[(0, &random)]);
    let f_zeros = make_file(&dir, "zeros.bin", &[(0, &zeros)]);
    // 1 MiB of data every 16 MiB, holes in between.
    let islands: Vec<(u64, &[u8])> = (0..4).map(|i| (i * (16 << 20), island.as_slice())).collect();
    let f_sparse = make_file(&dir, "sparse.bin", &islands);
    drop((random, zeros));

    let mut g = c.benchmark_group("hash_file");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(SIZE));
    let mut buf = Vec::new();
    for (name, file, block) in [
        ("random/4K", &f_random, 4096u64),
        ("random/64K", &f_random, 65536),
        ("zeros/4K", &f_zeros, 4096),
        ("sparse/4K", &f_sparse, 4096),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let h = hash_file(file, SIZE, block, &mut buf).unwrap();
                black_box(h.map)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
