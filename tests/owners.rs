//! Sharing is visible to a file's owner: FIEMAP flags a shared extent, so a
//! user who can make the run share their own file with a file they cannot
//! read learns that file's content, one guess per file. By default files
//! are shared only with files of the same owner; `--share-across-owners`
//! lifts that. On real btrfs and XFS volumes.

mod common;

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;

use common::*;
use dedupscan::corpus::Rng;

/// The unprivileged attacker.
const NOBODY: u32 = 65534;

fn owners(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let data = vol.path("data");
    let put = |rel: &str, bytes: &[u8], uid: u32| {
        let p = data.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        chown(&p, Some(uid), Some(uid)).unwrap();
        p
    };
    let secret = Rng::new(5).bytes(256 * 1024);
    let theirs = Rng::new(6).bytes(256 * 1024);
    // Root's secret, in a directory only root may enter, and a copy of it
    // elsewhere, also root's.
    let pin = put("root-only/pin.bin", &secret, 0);
    std::fs::set_permissions(data.join("root-only"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o600)).unwrap();
    let root_copy = put("backup/pin.bin", &secret, 0);
    // The attacker's guesses (one of them right) and two copies of a file
    // of their own.
    let home = data.join("home");
    for i in 0..4 {
        put(&format!("home/guess-{i}"), &Rng::new(100 + i).bytes(256 * 1024), NOBODY);
    }
    let hit = put("home/guess-hit", &secret, NOBODY);
    let (own_a, own_b) = (put("home/own-a", &theirs, NOBODY), put("home/own-b", &theirs, NOBODY));
    chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    let before = Snapshot::take(&data);
    let len = secret.len() as u64;

    let r = run_json(&vol, &[&data.to_string_lossy()]);
    assert_eq!(num(&r, "errors"), 0, "{r:#}");
    assert!(same_physical(&pin, 0, &root_copy, 0, len), "root's two copies were not shared: {r:#}");
    assert!(same_physical(&own_a, 0, &own_b, 0, len), "the user's two copies were not shared: {r:#}");
    assert_eq!(shared_bytes(&hit), 0, "the right guess was shared with root's file: {r:#}");
    assert!(!same_physical(&hit, 0, &pin, 0, 4096), "the right guess shares root's blocks");
    before.assert_same(&Snapshot::take(&data));
    // The preview agrees: nothing more to share.
    let again = run_json(&vol, &[&data.to_string_lossy(), "--dry-run", "--rehash"]);
    assert_eq!(num(&again, "duplicate_bytes"), 0, "{again:#}");

    // Opted in: every file is hashed again (the fingerprints were salted by
    // owner) and the guess is shared like any copy.
    let out = dedupscan().arg(&data).args(["--share-across-owners", "--progress=never"]).json().db(vol.db());
    let out = out.expect(0).run();
    assert!(out.stderr.contains("hashed again"), "{}", out.stderr);
    assert!(num(&out.json, "files_hashed") >= 8, "{:#}", out.json);
    assert!(same_physical(&hit, 0, &pin, 0, len), "opted in, the copies were not shared: {:#}", out.json);
    before.assert_same(&Snapshot::take(&data));
    owner_is(&hit, NOBODY);
}

fn owner_is(p: &Path, uid: u32) {
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(p).unwrap().uid(), uid, "{}", p.display());
}

#[test]
fn xfs_files_are_shared_only_with_files_of_their_owner() {
    owners(Fs::Xfs);
}

#[test]
fn btrfs_files_are_shared_only_with_files_of_their_owner() {
    owners(Fs::Btrfs);
}
