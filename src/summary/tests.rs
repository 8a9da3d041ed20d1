//! Tests of the `report` command's summary.

use super::*;

#[test]
fn directories_roll_up_like_du() {
    let mut by = HashMap::new();
    by.insert(PathBuf::from("/v/a/b"), 10);
    by.insert(PathBuf::from("/v/a/c"), 5);
    by.insert(PathBuf::from("/v/d"), 1);
    let root = common_dir([Path::new("/v/a/b"), Path::new("/v/a/c"), Path::new("/v/d")].into_iter());
    assert_eq!(root, PathBuf::from("/v"));
    let r = roll_up(by, &root);
    assert_eq!(r[Path::new("/v")], 16);
    assert_eq!(r[Path::new("/v/a")], 15);
    assert_eq!(r[Path::new("/v/a/b")], 10);
    assert!(!r.contains_key(Path::new("/")));
}
