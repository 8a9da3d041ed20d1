//! A file whose block map is past the bound (`too_large`: ~610 GiB of data
//! with 4 KiB blocks) is read once, not every run.
//!
//! Whether a file is past the bound shows only after that much of it was
//! read. Before schema v13 every run read such a file that far again and
//! refused it: a VM image store's nightly run read hundreds of GiB for
//! nothing. The test lowers the bound (`DEDUPSCAN_TEST_MAX_MAP_BYTES`, which
//! can only lower it) so that 4 MiB is "too large", and proves what was
//! read with the page cache: the file's pages are dropped before each run
//! and counted after it (`mincore`).

mod common;

use common::*;
use std::fs::File;
use std::path::Path;

/// Bytes of block map allowed: 682 blocks of data, 2.7 MiB at 4 KiB.
const BOUND: &str = "4096";

/// One run with the lowered bound; its report and stderr.
fn run(vol: &Volume, d: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let out = dedupscan()
        .arg(d)
        .args(extra)
        .json()
        .db(vol.db())
        .env("DEDUPSCAN_TEST_MAX_MAP_BYTES", BOUND)
        .expect(0)
        .expect(1)
        .run();
    validate_report(&out.json);
    (out.json, out.stderr)
}

fn refusals(vol: &Volume) -> i64 {
    let conn = rusqlite::Connection::open(vol.db()).unwrap();
    conn.query_row("SELECT count(*) FROM too_large", [], |r| r.get(0)).unwrap()
}

fn too_large_read_once(fs: Fs) {
    let Some(vol) = Volume::new(fs, 300) else { return };
    let d = vol.path("images");
    std::fs::create_dir(&d).unwrap();
    let mut rng = dedupscan::corpus::Rng::new(14);
    let big = d.join("thick.img");
    std::fs::write(&big, rng.bytes(4 << 20)).unwrap();
    // A pair beside it, shared as usual.
    let pair = rng.bytes(1 << 20);
    for name in ["a", "b"] {
        std::fs::write(d.join(name), &pair).unwrap();
    }
    let before = Snapshot::take(&d);

    // First run: read up to the bound, refused (exit 1), recorded.
    drop_pages(&big);
    let (r, err) = run(&vol, &d, &[]);
    assert_eq!(r["error_kinds"]["too_large"], 1, "{r:#}\n{err}");
    assert!(err.contains("thick.img: too_large:") && err.contains("not read again while it is unchanged"), "{err}");
    assert!(resident(&big) > 0, "the first run reads it");
    assert!(same_physical(&d.join("a"), 0, &d.join("b"), 0, 1 << 20), "the rest of the run goes on: {r:#}");
    assert_eq!(refusals(&vol), 1);
    // `report` names it.
    let listed = &db_report(&vol)["too_large_files"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed:#}");
    assert!(listed[0]["path"].as_str().unwrap().ends_with("/images/thick.img"), "{listed:#}");
    assert_eq!(listed[0]["size_bytes"], 4 << 20, "{listed:#}");
    let text = dedupscan().arg("report").db(vol.db()).expect(0).run().stdout;
    assert!(text.contains("too large to hash") && text.contains("thick.img"), "{text}");
    let html = vol.db().with_file_name("report.html");
    dedupscan().args(["report", "--html"]).arg(&html).db(vol.db()).expect(0).run();
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<section id=\"too-large\">") && page.contains("/images/thick.img</td>"), "{page}");

    // Unchanged: refused again, said again, not read (also by the weekly
    // full plan's kind of run: no `--incremental` is given here).
    for args in [&[][..], &["--incremental"][..]] {
        drop_pages(&big);
        let (r, err) = run(&vol, &d, args);
        assert_eq!(r["error_kinds"]["too_large"], 1, "{args:?}: {r:#}\n{err}");
        assert!(err.contains("has not changed since: not read again"), "{args:?}: {err}");
        assert_eq!(resident(&big), 0, "{args:?}: the unchanged refused file was read again");
    }
    // `--rehash` reads every file again.
    drop_pages(&big);
    let (r, _) = run(&vol, &d, &["--rehash"]);
    assert_eq!(r["error_kinds"]["too_large"], 1, "{r:#}");
    assert!(resident(&big) > 0, "--rehash reads it");
    before.assert_same(&Snapshot::take(&d));

    // Changed: read again (and refused again).
    std::fs::OpenOptions::new().append(true).open(&big).unwrap().set_len((4 << 20) + 4096).unwrap();
    drop_pages(&big);
    let (r, err) = run(&vol, &d, &[]);
    assert_eq!(r["error_kinds"]["too_large"], 1, "{r:#}");
    assert!(err.contains("not read again while it is unchanged"), "{err}");
    assert!(resident(&big) > 0, "a changed file is read again");
    assert_eq!(refusals(&vol), 1, "the refusal is replaced");

    // Shrunk below the bound: hashed, the refusal dropped, exit 0.
    File::options().write(true).open(&big).unwrap().set_len(1 << 20).unwrap();
    let (r, err) = run(&vol, &d, &[]);
    assert_eq!(r["errors"], 0, "{r:#}\n{err}");
    assert_eq!(refusals(&vol), 0, "{err}");
    assert_eq!(db_report(&vol)["too_large_files"], serde_json::json!([]));
}

#[test]
fn xfs_a_file_too_large_is_read_once() {
    too_large_read_once(Fs::Xfs);
}

#[test]
fn btrfs_a_file_too_large_is_read_once() {
    too_large_read_once(Fs::Btrfs);
}

/// A database of schema v12 (before the table): `report` reads it as it
/// is, and a run adds the table without hashing anything again.
#[test]
fn a_v12_database_is_read_and_upgraded_without_rehashing() {
    let Some(vol) = Volume::new(Fs::Xfs, 300) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("a"), dedupscan::corpus::Rng::new(3).bytes(40_960)).unwrap();
    let r = run_json(&vol, &["scan", s(&d)]);
    assert_eq!(num(&r, "files_hashed"), 1);
    let conn = rusqlite::Connection::open(vol.db()).unwrap();
    conn.execute_batch("DROP TABLE too_large; PRAGMA user_version = 12;").unwrap();
    drop(conn);
    assert_eq!(db_report(&vol)["too_large_files"], serde_json::json!([]));
    let r = run_json(&vol, &[s(&d)]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "files_unchanged")), (0, 1), "{r:#}");
    assert_eq!(refusals(&vol), 0, "the table is there again");
}
