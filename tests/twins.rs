//! A clone of a device mounted beside its original (a `dd` copy, an LVM
//! snapshot, a copied VM image): two filesystems with one UUID. Each keeps
//! its own default database, whichever is mounted first; a btrfs clone's
//! temporary fsid (new at every mount) names nothing; the two are never
//! taken for one filesystem.
//!
//! Before: the btrfs mounted second was named by its temporary fsid, so
//! every mount started a new database in /var/lib/dedupscan and read the
//! whole volume again; an XFS clone (`nouuid`) took turns with its original
//! in one database; and both given at once, the clone was dropped as "the
//! same directory through a bind mount" and never scanned.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use dedupscan::corpus::Rng;

/// Removes the default databases of one UUID when dropped.
struct DefaultDbs(String);

impl Drop for DefaultDbs {
    fn drop(&mut self) {
        for e in std::fs::read_dir("/var/lib/dedupscan").into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&self.0) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A run with the default database (no `--db`): the report and stderr.
fn run_default(args: &[&str]) -> (serde_json::Value, String) {
    let out = dedupscan().args(args).json().expect(0).run();
    validate_report(&out.json);
    (out.json, out.stderr)
}

fn hashed_and_db(r: &serde_json::Value) -> (u64, PathBuf) {
    (num(r, "files_hashed"), PathBuf::from(r["database"].as_str().unwrap()))
}

fn pairs_shared(dir: &Path, n: usize) {
    for k in 0..n {
        for c in ["a", "b"] {
            assert!(shared_bytes(&dir.join(format!("{k}{c}"))) > 0, "{}/{k}{c} not shared", dir.display());
        }
    }
}

fn twins(fs: Fs) {
    let Some(vol) = Volume::new(fs, 300) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(36);
    for k in 0..8 {
        let body = rng.bytes(192 << 10);
        std::fs::write(d.join(format!("{k}a")), &body).unwrap();
        std::fs::write(d.join(format!("{k}b")), &body).unwrap();
    }
    let (clone, _unmount) = vol.clone_beside();
    let cd = clone.join("d");
    let uuid = dedupscan::sys::fs::fs_info_of_path(&vol.mnt).unwrap().uuid;
    let _dbs = DefaultDbs(uuid.clone());
    let usual = dedupscan::config::default_db_path(&uuid).unwrap();
    let before = [Snapshot::take(&d), Snapshot::take(&cd)];

    // The original first: the usual database. The clone: the same UUID
    // (btrfs's temporary fsid is not it), a database of its own, said once.
    let (a, err) = run_default(&[s(&vol.mnt), "--incremental"]);
    assert_eq!(hashed_and_db(&a), (16, usual.clone()), "{err}\n{a:#}");
    let (b, err) = run_default(&[s(&clone), "--incremental"]);
    assert_eq!(b["filesystem_uuid"], a["filesystem_uuid"], "{b:#}");
    let (n, apart) = hashed_and_db(&b);
    assert!(n == 16 && apart != usual && apart.exists(), "{err}\n{b:#}");
    assert!(err.contains("keeps its records apart") && err.contains(&uuid), "{err}");
    pairs_shared(&d, 8);
    pairs_shared(&cd, 8);

    // Each rerun trusts only its own records: one file changed on the
    // clone is read on the clone, nothing on the original.
    std::fs::write(cd.join("0a"), rng.bytes(64 << 10)).unwrap();
    let (a, _) = run_default(&[s(&vol.mnt), "--incremental"]);
    assert_eq!(hashed_and_db(&a), (0, usual.clone()), "{a:#}");
    let (b, err) = run_default(&[s(&clone), "--incremental"]);
    assert_eq!(hashed_and_db(&b), (1, apart.clone()), "{b:#}");
    assert!(!err.contains("keeps its records apart"), "said again: {err}");

    // Mounted again the other way round (on btrfs the original now gets
    // the temporary fsid): still each its own database, nothing read.
    drop(_unmount);
    vol.remount_after(|_| vol.mount_clone(&clone));
    let _unmount = Unmount(clone.clone());
    let (a, _) = run_default(&[s(&vol.mnt), "--incremental"]);
    assert_eq!(hashed_and_db(&a), (0, usual.clone()), "{a:#}");
    assert_eq!(num(&a, "files_removed"), 0, "{a:#}");
    let (b, _) = run_default(&[s(&clone), "--incremental"]);
    assert_eq!(hashed_and_db(&b), (0, apart.clone()), "{b:#}");
    let report = dedupscan().args(["report", s(&clone)]).expect(0).run();
    assert!(report.stdout.contains(s(&apart)), "{}", report.stdout);

    // Both at once: two filesystems, refused before anything is read.
    let out = dedupscan().args([s(&vol.mnt), s(&clone)]).expect(2).run();
    assert!(out.stderr.contains("a clone of the same device"), "{}", out.stderr);

    before[0].assert_same(&Snapshot::take(&d));
    let mut changed = before[1].clone();
    changed.0.retain(|p, _| !p.ends_with("d/0a"));
    let mut after = Snapshot::take(&cd);
    after.0.retain(|p, _| !p.ends_with("d/0a"));
    changed.assert_same(&after);
}

#[test]
fn btrfs_a_clone_mounted_beside_its_original_keeps_its_own_records() {
    twins(Fs::Btrfs);
}

#[test]
fn xfs_a_clone_mounted_beside_its_original_keeps_its_own_records() {
    twins(Fs::Xfs);
}
