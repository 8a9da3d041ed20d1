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

/// `setpriv` arguments keeping in the bounding set only the capabilities
/// the shipped unit's `CapabilityBoundingSet=` names, less `without`.
fn unit_capabilities(without: &[&str]) -> Vec<String> {
    let unit =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd/dedupscan@.service"));
    let unit = unit.unwrap();
    let line =
        unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("the unit bounds capabilities");
    let caps: Vec<String> = line
        .split_whitespace()
        .filter(|c| !without.contains(c))
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let bounding = format!("--bounding-set=-all,{}", caps.join(","));
    ["setpriv", &bounding, "--inh-caps=-all", "--no-new-privs"].map(str::to_owned).to_vec()
}

/// Files of `NOBODY` in `dir` (made, mode 0700): two 2 MiB files, the
/// second sharing the first's first 1.75 MiB and then its own 256 KiB, so
/// on btrfs its one extent frees only once that 256 KiB is rewritten; and
/// a file with 1 MiB of written zeros between data, to be punched.
fn users_files(dir: &Path, seed: u64) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let put = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
        p
    };
    let a = Rng::new(seed).bytes(2 << 20);
    let mut b = a[..(7 << 18)].to_vec();
    b.extend(Rng::new(seed + 1).bytes(1 << 18));
    let mut z = Rng::new(seed + 2).bytes(1 << 20);
    z.extend(vec![0; 1 << 20]);
    z.extend(Rng::new(seed + 3).bytes(1 << 20));
    let paths = (put(&format!("a{seed}"), &a), put(&format!("b{seed}"), &b), put(&format!("z{seed}"), &z));
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    std::process::Command::new("sync").status().unwrap();
    paths
}

/// Run as root with only `caps` in the bounding set; the report and stderr.
fn run_with(vol: &Volume, caps: &[String], args: &[&Path], dry: bool) -> (serde_json::Value, String) {
    let cmd = dedupscan().under(caps).args(args).args(dry.then_some("--dry-run")).json().db(vol.db());
    let out = cmd.expect(0).expect(1).run();
    validate_report(&out.json);
    (out.json, out.stderr)
}

/// The shipped unit keeps only some capabilities. Without
/// `CAP_DAC_OVERRIDE`, root may create no file in a directory another user
/// owns, and the starting directory is where the run makes its unnamed
/// files: the rewrites' copies and the hole zeros are shared from. With
/// the unit's set as it was, a volume whose top directory a backup user
/// owns had every rewrite fail (a warning per file, the shared part pinned
/// for good) and no zero punched. Now the unit keeps the capability; a run
/// without it says so once, leaves the files needing a rewrite whole and
/// pending (`rewrite_not_allowed`), previews exactly that, and makes its
/// files in a later starting directory it may write.
fn units_capabilities_suffice(fs: Fs) {
    let Some(vol) = Volume::new(fs, 512) else { return };
    let (share, mine) = (vol.path("share"), vol.path("mine"));
    let (a1, b1, z1) = users_files(&share, 1);
    std::fs::create_dir(&mine).unwrap();
    let before = Snapshot::take(&share);
    let btrfs = fs == Fs::Btrfs;
    let (shared_part, zeros) = (7u64 << 18, 1u64 << 20);

    // Without CAP_DAC_OVERRIDE: a preview, then the run, agree.
    let weak = unit_capabilities(&["CAP_DAC_OVERRIDE"]);
    let (preview, _) = run_with(&vol, &weak, &[&share], true);
    let (r, err) = run_with(&vol, &weak, &[&share], false);
    let said = |what: &str| err.matches(what).count();
    assert_eq!(said("written zeros cannot be turned into holes: cannot make files in"), 1, "{err}");
    assert_eq!(num(&r, "zeros_to_holes_bytes"), 0, "{r:#}");
    assert_eq!(said("partly shared extents cannot be rewritten"), usize::from(btrfs), "{err}");
    let waiting = &r["pending"]["rewrite_not_allowed"];
    for key in ["pending", "pending_bytes", "duplicate_bytes", "pinned_bytes", "rewritten_bytes", "errors"] {
        assert_eq!(preview[key], r[key], "{key}: preview against run");
    }
    if btrfs {
        assert_eq!((waiting["files"].as_u64(), waiting["bytes"].as_u64()), (Some(1), Some(shared_part)), "{r:#}");
        assert!(!same_physical(&a1, 0, &b1, 0, 4096), "shared though its extent could not be freed");
        assert_eq!((num(&r, "pinned_bytes"), num(&r, "deduped_bytes")), (0, 0), "{r:#}");
    } else {
        assert!(waiting.is_null() && same_physical(&a1, 0, &b1, 0, shared_part), "{r:#}");
    }
    before.assert_same(&Snapshot::take(&share));

    // Still without it, but with a starting directory of root's after the
    // user's: the files are made there, and what waited is shared.
    let (r, err) = run_with(&vol, &weak, &[&share, &mine], false);
    assert!(!err.contains("cannot make files"), "{err}");
    assert_eq!((num(&r, "errors"), num(&r, "pending_bytes")), (0, 0), "{r:#}");
    assert!(same_physical(&a1, 0, &b1, 0, shared_part), "{r:#}");
    assert!(!btrfs || num(&r, "rewritten_bytes") >= 1 << 18, "{r:#}");

    // The unit's own set, on new files of the user's: everything done.
    let (a2, b2, z2) = users_files(&share.join("later"), 2);
    let before = Snapshot::take(&share);
    let free = free_bytes(&share);
    let (r, err) = run_with(&vol, &unit_capabilities(&[]), &[&share], false);
    assert_eq!((num(&r, "errors"), num(&r, "pending_bytes")), (0, 0), "{r:#}\n{err}");
    assert!(same_physical(&a2, 0, &b2, 0, shared_part), "{r:#}");
    assert_eq!(num(&r, "zeros_to_holes_bytes"), zeros, "{r:#}");
    assert_eq!(physical_blocks(&z2, 1 << 20, zeros), vec![None; 256], "the zeros are not a hole");
    assert!(!btrfs || num(&r, "rewritten_bytes") >= 1 << 18, "{r:#}");
    let freed = free_bytes(&share).saturating_sub(free);
    assert!(freed >= (shared_part + zeros) * 9 / 10, "freed {freed}: {r:#}");
    before.assert_same(&Snapshot::take(&share));
    owner_is(&z1, NOBODY);
}

#[test]
fn xfs_the_units_capabilities_suffice_for_a_directory_of_another_user() {
    units_capabilities_suffice(Fs::Xfs);
}

#[test]
fn btrfs_the_units_capabilities_suffice_for_a_directory_of_another_user() {
    units_capabilities_suffice(Fs::Btrfs);
}
