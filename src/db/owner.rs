//! Which database holds a filesystem's records when `--db` is not given.
//!
//! One per filesystem, named by its UUID: `<uuid>.sqlite`. A clone of its
//! device mounted beside it has the same UUID (`sys::twins`), and the two
//! must not take turns in one database: each run would find the other's
//! files changed and read them again, and `report` would show the other's
//! runs. So the database records the device its filesystem was on (`meta`
//! key `device`), and a filesystem whose twin owns it keeps its records in
//! `<uuid>+<device>.sqlite` (16 hex digits of the SHA-256 of the device's
//! name), from then on. Without a twin mounted, the usual database is
//! taken over, device name and all: a disk that came back under another
//! name keeps its records.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Db;

/// The `meta` key naming the device the database's filesystem was on.
pub const DEVICE_KEY: &str = "device";

/// The database for the filesystem `uuid` on the device named `device`,
/// `usual` being `<uuid>.sqlite` in the state directory, while filesystems
/// with the same UUID are mounted on the devices `twins`: the path, and
/// whether it is one kept apart from the usual one.
pub fn choose(usual: &Path, uuid: &str, device: Option<&str>, twins: &[String]) -> (PathBuf, bool) {
    choose_with(usual, uuid, device, twins, |p| p.exists(), recorded_device)
}

fn choose_with(
    usual: &Path,
    uuid: &str,
    device: Option<&str>,
    twins: &[String],
    exists: impl Fn(&Path) -> bool,
    owner: impl FnOnce(&Path) -> Option<String>,
) -> (PathBuf, bool) {
    let Some(device) = device else { return (usual.to_owned(), false) };
    let tag: String = Sha256::digest(device.as_bytes())[..8].iter().map(|b| format!("{b:02x}")).collect();
    let apart = usual.with_file_name(format!("{uuid}+{tag}.sqlite"));
    if exists(&apart) {
        return (apart, true);
    }
    if twins.is_empty() {
        return (usual.to_owned(), false);
    }
    match owner(usual) {
        Some(o) if o != device && twins.contains(&o) => (apart, true),
        _ => (usual.to_owned(), false),
    }
}

/// The device recorded in the database at `path`, if it exists and says.
fn recorded_device(path: &Path) -> Option<String> {
    if !path.exists() {
        return None;
    }
    Db::open_for_report(path).ok()?.meta(DEVICE_KEY).ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "6c3063b7-242b-4a2d-8a64-83a2693c9109";

    fn pick(device: Option<&str>, twins: &[&str], existing: &[&str], owner: Option<&str>) -> (String, bool) {
        let usual = PathBuf::from(format!("/var/lib/dedupscan/{U}.sqlite"));
        let twins: Vec<String> = twins.iter().map(|t| t.to_string()).collect();
        let exists = |p: &Path| existing.iter().any(|e| p.to_str().unwrap().contains(e));
        let (p, apart) = choose_with(&usual, U, device, &twins, exists, |_| owner.map(str::to_owned));
        (p.file_name().unwrap().to_str().unwrap().to_owned(), apart)
    }

    #[test]
    fn alone_a_filesystem_keeps_the_usual_database() {
        let usual = format!("{U}.sqlite");
        assert_eq!(pick(Some("loop:/a.img"), &[], &[], Some("loop:/other.img")), (usual.clone(), false));
        assert_eq!(pick(None, &["loop:/b.img"], &[], Some("loop:/b.img")), (usual.clone(), false));
        // Its twin mounted, but the usual database is its own, or nobody's.
        assert_eq!(pick(Some("loop:/a.img"), &["loop:/b.img"], &[], Some("loop:/a.img")), (usual.clone(), false));
        assert_eq!(pick(Some("loop:/a.img"), &["loop:/b.img"], &[], None), (usual.clone(), false));
        // Recorded by a device no longer mounted: a disk renamed.
        assert_eq!(pick(Some("loop:/a.img"), &["loop:/b.img"], &[], Some("dev:sdc1")), (usual, false));
    }

    #[test]
    fn a_twin_of_the_owner_keeps_its_records_apart_from_then_on() {
        let (name, apart) = pick(Some("loop:/a.img"), &["loop:/b.img"], &[], Some("loop:/b.img"));
        assert!(apart && name.starts_with(&format!("{U}+")) && name.ends_with(".sqlite"), "{name}");
        assert_eq!(name.len(), U.len() + 1 + 16 + ".sqlite".len());
        // Later, alone or not, it goes on using its own.
        assert_eq!(pick(Some("loop:/a.img"), &[], &[&name], Some("loop:/b.img")), (name.clone(), true));
        // Another device gets another name.
        assert_ne!(pick(Some("loop:/c.img"), &["loop:/b.img"], &[], Some("loop:/b.img")).0, name);
    }
}
