//! A file the plan uses in many ranges is opened (below the starting
//! paths, then checked) once per share worker, not once per range: a
//! "mosaic" made of pieces of 12 different files is the destination of 12
//! ranges, one from each source, so 12 units of work. Every open is traced
//! with strace; before the share workers kept their files, the mosaic was
//! opened 13 times in a run (by the scan, then once per range), now at most
//! 6 (the scan, and once per worker: at most 4). The run still shares every piece
//! and changes no file's contents, size, mode or mtime.

mod common;

use common::*;
use dedupscan::corpus::Rng;

const PIECE: usize = 64 << 10;
const SOURCES: usize = 12;

fn case(fs: Fs) {
    let Some(vol) = Volume::new(fs, 300) else { return };
    let dir = vol.path("t");
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng::new(77);
    let mut mosaic = Vec::new();
    for i in 0..SOURCES {
        // Each source: a piece between data of its own, so it stays
        // referenced whatever is shared (the source of its range), while
        // the mosaic is wholly covered (the destination of every range).
        let piece = rng.bytes(PIECE);
        let mut data = rng.bytes(PIECE);
        data.extend_from_slice(&piece);
        data.extend_from_slice(&rng.bytes(PIECE));
        std::fs::write(dir.join(format!("s{i:02}")), &data).unwrap();
        mosaic.extend_from_slice(&piece);
    }
    std::fs::write(dir.join("mosaic"), &mosaic).unwrap();
    sh(&mut std::process::Command::new("sync"));
    let before = Snapshot::take(&dir);

    let trace = vol.db().with_extension("trace");
    let strace = ["strace", "-f", "-qq", "-y", "-e", "trace=open,openat,openat2", "-o", s(&trace)];
    let out = dedupscan().under(strace).arg(&dir).json().db(vol.db()).expect(0).run();
    let report = out.json;
    assert_eq!(num(&report, "deduped_bytes"), (SOURCES * PIECE) as u64, "{report:#}");

    let needle = format!("{}>", dir.join("mosaic").display());
    let opens =
        std::fs::read_to_string(&trace).unwrap().lines().filter(|l| l.contains("= ") && l.ends_with(&needle)).count();
    assert!(
        (1..=6).contains(&opens),
        "the mosaic was opened {opens} times, once per range rather than once per worker"
    );

    for i in 0..SOURCES {
        let src = dir.join(format!("s{i:02}"));
        let at = (i * PIECE) as u64;
        assert!(same_physical(&src, PIECE as u64, &dir.join("mosaic"), at, PIECE as u64), "piece {i} not shared");
    }
    before.assert_same(&Snapshot::take(&dir));
}

#[test]
fn btrfs_a_file_in_many_ranges_is_opened_once_per_worker() {
    case(Fs::Btrfs);
}

#[test]
fn xfs_a_file_in_many_ranges_is_opened_once_per_worker() {
    case(Fs::Xfs);
}
