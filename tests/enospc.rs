//! A full disk: work that fails for lack of space is remembered and done by
//! the next run once there is room, even an `--incremental` run in which
//! nothing changed.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use dedupscan::corpus::Rng;

/// Write `path` until the volume is out of data space, in large then small
/// pieces, across a few transaction commits (btrfs gives reserved space
/// back at commit). What the test wrote before is flushed first, so that
/// it lies on disk as written, not in extents allocated while the filler
/// takes the space, in pieces that depend on the machine's load: a CI run
/// on a loaded machine once found an image's zeros waiting with 48 MiB
/// where it has 32 (not reproduced since; the likeliest cause).
fn fill(path: &std::path::Path) {
    sh(std::process::Command::new("sync").arg("-f").arg(path.parent().unwrap()));
    let mut f = std::fs::File::create(path).unwrap();
    let big = vec![0x5au8; 1 << 20];
    for piece in [1usize << 20, 64 << 10, 4 << 10] {
        for _ in 0..3 {
            while f.write_all(&big[..piece]).and_then(|_| f.flush()).is_ok() {}
            let _ = f.sync_all();
        }
    }
}

/// Room again (the filler gone), nothing changed on the volume: an
/// `--incremental` run of `d`, which hashes nothing and changes no file;
/// its report and the bytes it freed (statfs).
fn room_again(vol: &Volume, d: &std::path::Path, before: &Snapshot) -> (serde_json::Value, i64) {
    std::fs::remove_file(vol.path("filler")).unwrap();
    let free0 = free_bytes(&vol.mnt);
    let r = run_json(vol, &[d.to_str().unwrap(), "--incremental"]);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(d));
    assert_eq!(num(&r, "files_hashed"), 0, "{r:#}");
    (r, freed)
}

#[test]
fn bookends_stuck_on_a_full_disk_are_freed_by_the_next_incremental_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(7);
    let len = 16 << 20;
    let a = rng.bytes(len);
    let mut b = a.clone();
    for blk in [3usize, 2000, 3500] {
        b[blk * 4096..(blk + 1) * 4096].copy_from_slice(&rng.bytes(4096));
    }
    std::fs::write(d.join("a"), &a).unwrap();
    std::fs::write(d.join("b"), &b).unwrap();
    let path = d.to_str().unwrap();
    let before = Snapshot::take(&d);
    fill(&vol.path("filler"));

    // Full: the three blocks of b cannot be rewritten, so b's extent could
    // not be freed; b is left whole for later and said so.
    // No reserve: the kernel's own ENOSPC is met (the default keeps 1% of
    // the volume free and would refuse the copy first; tested below).
    let first = run_json(&vol, &[path, "--incremental", "--keep-free", "0"]);
    before.assert_same(&Snapshot::take(&d));
    assert!(num(&first, "pending_bytes") > 0, "nothing pending on a full disk: {first:#}");
    assert!(first["pending"]["no_space_rewrite"]["files"].as_u64() == Some(1), "{first:#}");
    assert!(first["error_kinds"]["no_space"].as_u64().is_some(), "{first:#}");
    let rep = db_report(&vol);
    assert_eq!(num(&rep, "pending_bytes"), num(&first, "pending_bytes"), "{rep:#}");

    // Room again; nothing changed on the volume.
    let (second, freed) = room_again(&vol, &d, &before);
    assert_eq!(num(&second, "rewritten_bytes"), 3 * 4096, "{second:#}");
    assert_eq!(num(&second, "pending_bytes"), 0, "{second:#}");
    let want = (len - 3 * 4096) as i64;
    assert!(freed >= want * 95 / 100, "the stuck space was not freed: {freed} of {want}: {second:#}");
    assert!(same_physical(&d.join("a"), 4 * 4096, &d.join("b"), 4 * 4096, 1996 * 4096));
    assert_eq!(num(&db_report(&vol), "pending_bytes"), 0);
}

/// A full disk under the zero pass: the data sharing an extent with an
/// image's written zeros cannot be copied out (the kernel's `ENOSPC`, no
/// reserve asked), so the zeros stay; said and counted once, and the
/// image is left pending (`zeros_keep_free`). Once there is room, the
/// next incremental run, nothing changed, frees them. Before, the file
/// was an error and the incremental run did nothing (the weekly full
/// plan would have).
#[test]
fn zeros_stuck_on_a_full_disk_are_freed_by_the_next_incremental_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("image"), one_pass_image(32, 40)).unwrap();
    let path = d.to_str().unwrap();
    let before = Snapshot::take(&d);
    fill(&vol.path("filler"));
    let first = run_json(&vol, &[path, "--keep-free", "0"]);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(num(&first, "zeros_to_holes_bytes"), 0, "{first:#}");
    assert_eq!(first["pending"]["zeros_keep_free"]["files"].as_u64(), Some(1), "{first:#}");
    assert_eq!((num(&first, "pending_bytes"), num(&first, "errors")), (32 << 20, 1), "{first:#}");
    assert_eq!(first["error_kinds"]["no_space"].as_u64(), Some(1), "{first:#}");

    let (second, freed) = room_again(&vol, &d, &before);
    assert_eq!(num(&second, "zeros_to_holes_bytes"), 32 << 20, "{second:#}");
    assert_eq!((num(&second, "pending_bytes"), num(&second, "errors")), (0, 0), "{second:#}");
    assert!(freed >= 30 << 20, "the zeros' space was not freed: {freed}: {second:#}");
}

/// A disk filled to the last block (or a quota to its limit), no reserve
/// asked: the kernel refuses the first copies (`ENOSPC`), and sharing the
/// whole copies then frees room. The files left whole wait for it in a
/// later round of the same run, as those `--keep-free` made wait do: said
/// once, counted once, nothing pending. Before, each was warned about and
/// counted, and left for the next run.
#[test]
fn btrfs_files_refused_for_a_full_disk_are_shared_later_in_the_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(13);
    let whole = rng.bytes(16 << 20);
    std::fs::write(d.join("whole"), &whole).unwrap();
    std::fs::write(d.join("whole-copy"), &whole).unwrap();
    // Near-copies: all but one 4 KiB block in the middle shared; each
    // frees its 1 MiB extent once that block is rewritten.
    let near = |i: usize| (d.join(format!("a{i}")), d.join(format!("b{i}")));
    for i in 0..8 {
        let a = rng.bytes(1 << 20);
        let mut b = a.clone();
        b[512 << 10..(512 << 10) + 4096].copy_from_slice(&rng.bytes(4096));
        std::fs::write(near(i).0, &a).unwrap();
        std::fs::write(near(i).1, &b).unwrap();
    }
    let before = Snapshot::take(&d);
    fill(&vol.path("filler"));
    let free0 = free_bytes(&vol.mnt);

    let out = dedupscan().args([s(&d), "--keep-free", "0", "-v"]).json().db(vol.db()).expect(1).run();
    let (r, err) = (&out.json, &out.stderr);
    validate_report(r);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(err.matches("no space to rewrite").count(), 1, "{err}");
    assert!(err.contains("3/3 share: again"), "no second round: {err}");
    assert_eq!((num(r, "errors"), num(&r["error_kinds"], "no_space")), (1, 1), "{r:#}");
    assert_eq!((num(r, "pending_bytes"), num(r, "rewritten_bytes")), (0, 8 * 4096), "{r:#}");
    for i in 0..8 {
        let (a, b) = near(i);
        assert!(same_physical(&a, 0, &b, 0, 512 << 10), "b{i} not shared: {r:#}");
    }
    let want = (16 << 20) + 8 * ((1 << 20) - 4096);
    assert!(freed >= want * 95 / 100, "freed {freed} of {want}: {r:#}");
}

/// A subvolume under a btrfs qgroup limit, 24 MiB above its use: `statfs`
/// does not show the limit, so the budget did not see it, the copies met
/// `EDQUOT` (an error), and while they held the quota so would any other
/// writer in the subvolume. The budget now takes the limit as the volume's
/// size: it refuses the copies first (said once), the kernel refuses
/// nothing, and the rounds share what waited. (Sampled every millisecond,
/// the room the limit leaves still dips below the reserve for moments:
/// the sharing's own metadata reservations count against it.)
#[test]
fn btrfs_rewrites_leave_a_qgroup_limit_the_room_keep_free_asks_for() {
    qgroup_limited(false);
}

/// The same limit set on a group the subvolume is a member of (`1/100`,
/// as snapper's `1/0`): a write counts against it too. Fails when only the
/// subvolume's own qgroup is read (the kernel refuses a copy).
#[test]
fn btrfs_rewrites_leave_a_parent_qgroup_limit_the_room_keep_free_asks_for() {
    qgroup_limited(true);
}

fn qgroup_limited(in_group: bool) {
    use std::os::fd::AsFd;
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    btrfs(&["quota", "enable"], &vol.mnt);
    let sub = vol.path("v");
    btrfs(&["subvolume", "create"], &sub);
    let limit_on = |size: &str| match in_group {
        true => btrfs(&["qgroup", "limit", size, "1/100"], &vol.mnt),
        false => btrfs(&["qgroup", "limit", size], &sub),
    };
    let fd = std::fs::File::open(&sub).unwrap();
    if in_group {
        let id = dedupscan::sys::fs::volume_key(fd.as_fd()).unwrap();
        btrfs(&["qgroup", "create", "1/100"], &vol.mnt);
        btrfs(&["qgroup", "assign", &format!("0/{id}"), "1/100"], &vol.mnt);
    }
    let d = sub.join("d");
    rewrite_pairs(&d);
    let whole = Rng::new(14).bytes(16 << 20);
    std::fs::write(d.join("whole"), &whole).unwrap();
    std::fs::write(d.join("whole-copy"), &whole).unwrap();
    let before = Snapshot::take(&d);
    free_bytes(&vol.mnt);
    btrfs(&["quota", "rescan", "-w"], &vol.mnt);
    limit_on("1G");
    let room = || dedupscan::sys::qgroup::qgroup_room(fd.as_fd()).expect("a qgroup limit").0;
    let limit = (1 << 30) - room() + (24 << 20);
    limit_on(&limit.to_string());
    assert!(room() <= 24 << 20, "the limit is not seen: {}", room());

    let out = dedupscan().args([s(&d), "-v"]).json().db(vol.db()).expect(0).expect(1).run();
    let (r, err) = (&out.json, &out.stderr);
    validate_report(r);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!(num(r, "errors"), 0, "the kernel refused a copy: {err}");
    assert!(err.contains("qgroup limit") && err.contains("3/3 share: again"), "{err}");
    assert_eq!((pairs_shared(&d), num(r, "pending_bytes")), (48, 0), "{r:#}");
    assert!(same_physical(&d.join("whole"), 0, &d.join("whole-copy"), 0, 16 << 20));
}

/// A full temporary directory (`/var/tmp` is often the root filesystem,
/// not the volume being shared) does not stop the run: the plan's first
/// grouping then reads the database once per slice, and the plan's batches
/// and the `--list` stay in memory. Tiny limits
/// (`DEDUPSCAN_TEST_SMALL_BATCHES`) send all three to temporary files from
/// the first few blocks and ranges.
#[test]
fn a_full_temporary_directory_does_not_stop_the_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 256) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(5);
    for i in 0..12 {
        let a = rng.bytes(64 << 10);
        let mut b = a.clone();
        b[i * 4096..i * 4096 + 8].copy_from_slice(b"changed!");
        std::fs::write(d.join(format!("a{i}")), &a).unwrap();
        std::fs::write(d.join(format!("b{i}")), &b).unwrap();
    }
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut mount = std::process::Command::new("mount");
    assert!(mount.args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(tmp.path()).status().unwrap().success());
    let _unmount = Unmount(tmp.path().to_owned());
    fill(&tmp.path().join("filler"));
    let before = Snapshot::take(&d);
    let path = d.to_str().unwrap();
    let run = |tmpdir: &std::path::Path, args: &[&str]| {
        let out = dedupscan().arg(path).args(args).json().db(vol.db()).env("DEDUPSCAN_TEST_SMALL_BATCHES", "1");
        out.env("TMPDIR", tmpdir).expect(0).run().json
    };
    let room = tempfile::tempdir_in("/var/tmp").unwrap();
    let planned = num(&run(room.path(), &["--dry-run"]), "duplicate_bytes");
    assert!(planned >= 12 * (60 << 10), "planned {planned}");
    assert_eq!(num(&run(tmp.path(), &["--dry-run"]), "duplicate_bytes"), planned);
    let listed = |r: &serde_json::Value| r["ranges"].as_array().map(|l| l.len()).unwrap_or(0);
    let dry = run(room.path(), &["--dry-run", "--list"]);
    assert!(listed(&dry) >= 12, "{dry:#}");
    let r = run(tmp.path(), &["--list"]);
    before.assert_same(&Snapshot::take(&d));
    assert_eq!((num(&r, "duplicate_bytes"), num(&r, "deduped_bytes")), (planned, planned), "{r:#}");
    assert_eq!(r["ranges"], dry["ranges"], "the list, kept in memory");
}

/// Bytes available to an unprivileged writer on the volume, now (no
/// flush: what another program would be told at this moment).
fn available(path: &std::path::Path) -> u64 {
    let st = nix::sys::statfs::statfs(path).unwrap();
    st.blocks_available() * st.block_size() as u64
}

/// 48 pairs of 1 MiB files sharing their first 256 KiB: on btrfs each
/// destination's rest (768 KiB) is rewritten, 36 MiB in all, before any
/// range is shared; each rewrite frees a 1 MiB extent once its range is.
fn rewrite_pairs(d: &std::path::Path) {
    std::fs::create_dir_all(d).unwrap();
    let mut rng = Rng::new(11);
    for i in 0..48 {
        let a = rng.bytes(1 << 20);
        let mut b = a.clone();
        b[256 << 10..].copy_from_slice(&rng.bytes(768 << 10));
        std::fs::write(d.join(format!("a{i}")), &a).unwrap();
        std::fs::write(d.join(format!("b{i}")), &b).unwrap();
    }
}

/// How many of [`rewrite_pairs`]'s pairs share their first 256 KiB.
fn pairs_shared(d: &std::path::Path) -> usize {
    let one = |i| same_physical(&d.join(format!("a{i}")), 0, &d.join(format!("b{i}")), 0, 256 << 10);
    (0..48).filter(|&i| one(i)).count()
}

/// A dry run of `d` with `--keep-free keep`, before the run: its report.
fn preview(vol: &Volume, d: &std::path::Path, keep: &str) -> serde_json::Value {
    let before = Snapshot::take(d);
    let dry = dedupscan().args([s(d), "--keep-free", keep, "--dry-run"]).json().db(vol.db()).expect(0).run();
    validate_report(&dry.json);
    before.assert_same(&Snapshot::take(d));
    dry.json
}

/// The run `r` did what the preview `dry` said it would.
fn assert_previewed(dry: &serde_json::Value, r: &serde_json::Value) {
    for k in ["duplicate_bytes", "rewritten_bytes", "pinned_bytes", "already_shared_bytes", "pending_bytes"] {
        assert_eq!(num(dry, k), num(r, k), "{k}: the preview {dry:#}, the run {r:#}");
    }
}

/// The lowest [`available`] seen every millisecond while `f` runs.
fn lowest_available<T>(mnt: &std::path::Path, f: impl FnOnce() -> T) -> (u64, T) {
    /// Stops the sampler however `f` ends: a panic in it must fail the
    /// test, not leave the scope waiting for the sampler forever.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let (stop, low) = (AtomicBool::new(false), AtomicU64::new(u64::MAX));
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                low.fetch_min(available(mnt), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        let out = {
            let _stop = Stop(&stop);
            f()
        };
        (low.load(Ordering::Relaxed), out)
    })
}

/// The rewrites' copies hold space until the old extents are released. On
/// a nearly full volume other programs must still find the room
/// `--keep-free` keeps: the run stays above it throughout (statfs sampled
/// every millisecond) and rewrites what fits; the other files wait, not
/// as errors, said once, and are tried again in the room the sharing
/// freed; what still waits is pending, and the next run, with room again,
/// shares it. The preview says what the run then does, rounds and all.
/// Fails without the budget: the copies take 36 MiB of the 12 MiB above
/// the reserve; without the second round (as many rewritten as fit in the
/// first); and with a preview that measures its budget once and stops
/// there (8–16 rewritten, the rest said to wait).
#[test]
fn btrfs_rewrites_leave_the_free_space_keep_free_asks_for() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("d");
    rewrite_pairs(&d);
    let before = Snapshot::take(&d);
    // About 60 MiB available; keep all but 12 MiB of it.
    let filler = vol.path("filler");
    free_bytes(&vol.mnt);
    std::fs::write(&filler, vec![0x5au8; (available(&vol.mnt) - (60 << 20)) as usize]).unwrap();
    free_bytes(&vol.mnt);
    let keep = available(&vol.mnt) - (12 << 20);
    let keep_arg = keep.to_string();

    // The preview counts its copies against the same budget, credited
    // with what its sharing would free: it says which files wait at
    // first, and that the run's later rounds take them.
    let dry =
        dedupscan().args([s(&d), "--keep-free", &keep_arg, "--dry-run", "-v"]).json().db(vol.db()).expect(0).run();
    validate_report(&dry.json);
    assert_eq!(dry.stderr.matches("partly shared extents").count(), 1, "said once: {}", dry.stderr);
    assert!(dry.stderr.contains("would wait for the room this run's sharing would free"), "{}", dry.stderr);
    assert!(dry.stderr.contains("3/3 verify: again"), "no second round in the preview: {}", dry.stderr);
    before.assert_same(&Snapshot::take(&d));

    let run = || dedupscan().args([s(&d), "--keep-free", &keep_arg, "-v"]).json().db(vol.db()).expect(0).run();
    let (low, out) = lowest_available(&vol.mnt, run);
    let r = &out.json;
    validate_report(r);
    assert!(low + (2 << 20) >= keep, "available went down to {low}, below --keep-free {keep}: {r:#}");
    let rest = 768 << 10;
    let done = num(r, "rewritten_bytes") / rest;
    // More than fit in the 12 MiB at first: the run shares those, then
    // rewrites more in the room that sharing freed.
    assert!(done > 16, "no second round: {done} rewritten: {r:#}");
    assert!(out.stderr.contains("3/3 share: again"), "{}", out.stderr);
    assert_eq!(r["pending"]["keep_free"]["files"].as_u64().unwrap_or(0), 48 - done, "{r:#}");
    assert!(r["error_kinds"].as_object().is_none_or(|k| k.is_empty()), "{r:#}");
    assert_eq!(out.stderr.matches("partly shared extents").count(), 1, "{}", out.stderr);
    assert_eq!(pairs_shared(&d) as u64, done);
    // Only the destinations rewritten are shared: 256 KiB each.
    assert_eq!(num(r, "duplicate_bytes"), done * (256 << 10), "{r:#}");
    assert_previewed(&dry.json, r);

    // Room again: the next run, incremental, with the default reserve
    // (1%), shares the rest.
    std::fs::remove_file(&filler).unwrap();
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "pending_bytes")), (0, 0), "{r:#}");
    assert_eq!(num(&r, "rewritten_bytes"), (48 - done) * rest, "{r:#}");
    assert_eq!(pairs_shared(&d), 48);
    before.assert_same(&Snapshot::take(&d));
}

/// Files that waited for room are shared in later rounds of the same run,
/// and counted once: 40 triples (one source, two near-copies sharing its
/// first 256 KiB), 12 MiB above the reserve for 60 MiB of copies. Groups
/// planned again hold copies an earlier round shared; those are found
/// shared and not counted as "already shared" by the run.
#[test]
fn btrfs_files_that_waited_for_room_are_shared_later_in_the_run() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    let mut rng = Rng::new(12);
    let name = |i: usize, k: usize| d.join(format!("t{i}_{k}"));
    for i in 0..40 {
        let a = rng.bytes(1 << 20);
        std::fs::write(name(i, 0), &a).unwrap();
        for k in 1..3 {
            std::fs::write(name(i, k), [&a[..256 << 10], &rng.bytes(768 << 10)].concat()).unwrap();
        }
    }
    let before = Snapshot::take(&d);
    free_bytes(&vol.mnt);
    std::fs::write(vol.path("filler"), vec![0x5au8; (available(&vol.mnt) - (60 << 20)) as usize]).unwrap();
    let free0 = free_bytes(&vol.mnt);
    let keep = (available(&vol.mnt) - (12 << 20)).to_string();

    let dry = preview(&vol, &d, &keep);
    let out = dedupscan().args([s(&d), "--keep-free", &keep, "-v"]).json().db(vol.db()).expect(0).run();
    let r = &out.json;
    validate_report(r);
    assert_previewed(&dry, r);
    let freed = free_bytes(&vol.mnt) as i64 - free0 as i64;
    assert!(out.stderr.contains("3/3 share: again"), "no second round: {}", out.stderr);
    assert_eq!((num(r, "deduped_bytes"), num(r, "pending_bytes")), (80 * (256 << 10), 0), "{r:#}");
    assert_eq!((num(r, "already_shared_bytes"), num(r, "errors")), (0, 0), "counted twice: {r:#}");
    assert_eq!(num(r, "rewritten_bytes"), 80 * (768 << 10), "{r:#}");
    assert!(freed >= 80 * (256 << 10) * 95 / 100, "freed {freed}: {r:#}");
    for i in 0..40 {
        for k in 1..3 {
            assert!(same_physical(&name(i, 0), 0, &name(i, k), 0, 256 << 10), "t{i}_{k} not shared");
        }
    }
    before.assert_same(&Snapshot::take(&d));
}

/// `dfile` (8.5 MiB in one extent: A, 512 KiB of its own, A again) and
/// its copy `e`: `dfile` is the source of both, and its extent is freed
/// only once its first 4.5 MiB are rewritten (its second A then shares the
/// copy of the first). With `room`, also `f` and its copy `g` (16 MiB):
/// sharing them frees room for that rewrite. The volume is filled so that
/// the rewrite does not fit above `--keep-free` at first (without `room`,
/// never); returns the volume, the directory, its contents and the
/// `--keep-free` argument.
fn waiting_source(room: bool) -> Option<(Volume, std::path::PathBuf, Snapshot, String)> {
    let vol = Volume::new(Fs::Btrfs, 256)?;
    let d = vol.path("d");
    std::fs::create_dir_all(&d).unwrap();
    let mut rng = Rng::new(21);
    let a = rng.bytes(4 << 20);
    let aba = [&a[..], &rng.bytes(512 << 10), &a[..]].concat();
    std::fs::write(d.join("dfile"), &aba).unwrap();
    std::fs::write(d.join("e"), &aba).unwrap();
    if room {
        let f = rng.bytes(16 << 20);
        std::fs::write(d.join("f"), &f).unwrap();
        std::fs::write(d.join("g"), &f).unwrap();
    }
    assert_eq!(extents(&d.join("dfile")), 1, "the test needs dfile in one extent");
    let before = Snapshot::take(&d);
    free_bytes(&vol.mnt);
    std::fs::write(vol.path("filler"), vec![0x5au8; (available(&vol.mnt) - (40 << 20)) as usize]).unwrap();
    free_bytes(&vol.mnt);
    // With room to come, 512 KiB above the reserve; else 16 MiB below it,
    // more than sharing `e` frees.
    let keep = if room { available(&vol.mnt) - (512 << 10) } else { available(&vol.mnt) + (16 << 20) };
    Some((vol, d, before, keep.to_string()))
}

/// A file left whole for `--keep-free` is no source either while another
/// round may come: its copy `e`, shared from the old extent, would keep
/// that extent, the second A and all, for good (no rewrite of `dfile`
/// could free it then: 4 MiB here, 32 MiB of the layouts corpus). The copy
/// waits with it, and the round after the room came rewrites `dfile` and
/// shares both. Fails when copies are shared from a source left whole:
/// 24.5 MiB freed, `dfile` pending. The preview says what the run does.
#[test]
fn btrfs_copies_of_a_file_left_whole_wait_for_its_rewrite() {
    let Some((vol, d, before, keep)) = waiting_source(true) else { return };
    let len = (8 << 20) + (512 << 10);
    let old = physical_blocks(&d.join("dfile"), 0, len);
    let dry = preview(&vol, &d, &keep);
    let free0 = free_bytes(&vol.mnt);
    let out = dedupscan().args([s(&d), "--keep-free", &keep, "-v"]).json().db(vol.db()).expect(0).run();
    let r = &out.json;
    let freed = free_bytes(&vol.mnt) - free0;
    assert_previewed(&dry, r);
    assert!(out.stderr.contains("3/3 share: again"), "no second round: {}", out.stderr);
    assert_eq!((num(r, "pending_bytes"), num(r, "rewritten_bytes")), (0, (4 << 20) + (512 << 10)), "{r:#}");
    let (dfile, e) = (d.join("dfile"), d.join("e"));
    assert!(same_physical(&dfile, 0, &e, 0, len) && same_physical(&dfile, 0, &dfile, (4 << 20) + (512 << 10), 4 << 20));
    let now = physical_blocks(&dfile, 0, len);
    assert!(now.iter().all(|b| !old.contains(b)), "dfile still in its old extent");
    // dfile 8.5 + e 8.5 + f 16 + g 16 MiB were 49; now dfile's copy 4.5, f 16.
    assert!(freed >= (28 << 20) + (256 << 10), "freed {freed}: {r:#}");
    before.assert_same(&Snapshot::take(&d));
}

/// Where no room comes, the copies that waited for their source are shared
/// from its old extent in the last round, as before copies waited: `e` is
/// freed. Fails if they wait for good. The preview says so too; that
/// `dfile` waits, where the run may find its extent shared with `e` by then
/// and share its repeat into it (see `pipeline/rounds.rs`).
#[test]
fn btrfs_copies_of_a_file_left_whole_are_shared_from_it_when_no_room_comes() {
    let Some((vol, d, before, keep)) = waiting_source(false) else { return };
    let len = (8 << 20) + (512 << 10);
    let dry = preview(&vol, &d, &keep);
    assert_eq!((num(&dry, "duplicate_bytes"), num(&dry, "rewritten_bytes")), (len, 0), "{dry:#}");
    assert_eq!(dry["pending"]["keep_free"]["files"].as_u64(), Some(1), "{dry:#}");
    let free0 = free_bytes(&vol.mnt);
    let out = dedupscan().args([s(&d), "--keep-free", &keep, "-v"]).json().db(vol.db()).expect(0).run();
    let r = &out.json;
    let freed = free_bytes(&vol.mnt) - free0;
    assert!(same_physical(&d.join("dfile"), 0, &d.join("e"), 0, len), "e not shared: {r:#}");
    assert!(out.stderr.contains("3/3 share: again"), "no last round: {}", out.stderr);
    // `dfile` waits for room, or, once `e` keeps its extent, is found to
    // free nothing by a rewrite (whether that shows depends on when btrfs
    // commits): nothing else pending.
    assert!(r["pending"].as_object().unwrap().keys().all(|k| k == "keep_free"), "{r:#}");
    assert!(freed >= len - (256 << 10), "freed {freed}: {r:#}");
    before.assert_same(&Snapshot::take(&d));
}
