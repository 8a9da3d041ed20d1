//! Sharing undone behind the database's back is found again.
//!
//! `btrfs filesystem defragment -c` (compressing existing data, a common
//! step after turning compression on) rewrites every extent it touches
//! unshared, and leaves the files' size, mtime and ctime as they were. To
//! change detection nothing happened, so incremental runs never looked at
//! those files again: the space was lost for good, whatever the nightly
//! timer ran. A run now plans every file again once the last run that did
//! is more than `--full-plan-days` days old (7 by default): the week is
//! aged here in the database, as a week of nightly runs would.

mod common;

use std::path::Path;

use common::*;
use dedupscan::corpus::Rng;

/// Set back, by `days` days, when each recorded complete run last planned
/// every file.
fn age_full_plans(db: &Path, days: u64) {
    let c = rusqlite::Connection::open(db).unwrap();
    let json: String =
        c.query_row("SELECT value FROM meta WHERE key = 'complete_share_runs'", [], |r| r.get(0)).unwrap();
    let mut runs: serde_json::Value = serde_json::from_str(&json).unwrap();
    for r in runs.as_array_mut().unwrap() {
        let at = r["full_at"].as_u64().expect("full_at recorded");
        r["full_at"] = (at - days * 86_400).into();
    }
    c.execute("UPDATE meta SET value = ?1 WHERE key = 'complete_share_runs'", [runs.to_string()]).unwrap();
}

#[test]
fn btrfs_sharing_a_defragment_undid_is_found_again_within_a_week() {
    let Some(vol) = Volume::new(Fs::Btrfs, 512) else { return };
    let d = vol.path("d");
    std::fs::create_dir(&d).unwrap();
    let mut rng = Rng::new(47);
    let data = rng.bytes(3 << 20);
    let (a, b) = (d.join("a"), d.join("b"));
    std::fs::write(&a, &data).unwrap();
    std::fs::write(&b, &data).unwrap();
    std::fs::write(d.join("c"), rng.bytes(2 << 20)).unwrap();
    let before = Snapshot::take(&d);
    let r = run_json(&vol, &[s(&d)]);
    assert_eq!(num(&r, "deduped_bytes"), 3 << 20, "{r:#}");
    assert!(same_physical(&a, 0, &b, 0, 3 << 20));

    sh(std::process::Command::new("btrfs").args(["filesystem", "defragment", "-f", "-czstd"]).arg(&a).arg(&b));
    sh(&mut std::process::Command::new("sync"));
    assert!(!same_physical(&a, 0, &b, 0, 3 << 20), "the defragment left them shared: no case to test");
    before.assert_same(&Snapshot::take(&d));
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!((num(&r, "files_unchanged"), num(&r, "ranges_planned")), (3, 0), "{r:#}");

    // Six days on: still within the week.
    age_full_plans(&vol.db(), 6);
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!(num(&r, "ranges_planned"), 0, "{r:#}");
    // Eight days on, unless told never to.
    age_full_plans(&vol.db(), 2);
    let r = run_json(&vol, &[s(&d), "--incremental", "--full-plan-days", "0"]);
    assert_eq!(num(&r, "ranges_planned"), 0, "{r:#}");
    let free = free_bytes(&d);
    let r = run_json(&vol, &[s(&d), "--incremental", "-v"]);
    assert_eq!((num(&r, "files_hashed"), num(&r, "ranges_planned")), (0, 1), "{r:#}");
    assert_eq!(r["planned_every_file"], true, "{r:#}");
    assert!(same_physical(&a, 0, &b, 0, 3 << 20), "not shared again: {r:#}");
    before.assert_same(&Snapshot::take(&d));
    assert!(free_bytes(&d) > free + (1 << 20), "nothing freed: {r:#}");
    // That run planned every file: the next week starts from it.
    let r = run_json(&vol, &[s(&d), "--incremental"]);
    assert_eq!((num(&r, "ranges_planned"), &r["planned_every_file"]), (0, &false.into()), "{r:#}");
}
