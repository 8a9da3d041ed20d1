//! Unit tests of the crawl on a temporary directory.

use super::*;

/// The fd walker finds every file of a wide and deep tree exactly once,
/// ends, and counts what it skips.
#[test]
fn walks_a_tree_completely_and_counts_skips() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("t");
    let mut want = std::collections::BTreeSet::new();
    for i in 0..40 {
        // Deep chains and wide directories.
        let dir = root.join(format!("d{i}")).join(format!("e{}", i % 3)).join("f");
        std::fs::create_dir_all(&dir).unwrap();
        for j in 0..25 {
            let p = dir.join(format!("x{j}"));
            std::fs::write(&p, b"data").unwrap();
            want.insert(p);
        }
        std::fs::write(dir.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("link")).unwrap();
    }
    // One directory wider than a crawl thread's batch (FOUND_BATCH).
    let wide = root.join("wide");
    std::fs::create_dir(&wide).unwrap();
    for j in 0..(2 * FOUND_BATCH + 5) {
        let p = wide.join(format!("w{j}"));
        std::fs::write(&p, b"data").unwrap();
        want.insert(p);
    }
    std::fs::hard_link(root.join("d0/e0/f/x0"), root.join("d0/e0/x0-again")).unwrap();
    std::fs::create_dir_all(root.join("d1/marked/deep")).unwrap();
    std::fs::write(root.join("d1/marked/.nodedup"), b"").unwrap();
    std::fs::write(root.join("d1/marked/deep/x"), b"data").unwrap();
    let tree = Tree::open(std::slice::from_ref(&root)).unwrap();
    let policy = Policy::new(&[], None).unwrap();
    let stop = AtomicBool::new(false);
    let mut got = Vec::new();
    let r = walk(&tree, FsKind::Other, &policy, &crate::progress::Silent, &stop, |c| got.push(c.path), || ());
    got.sort();
    let dedup: std::collections::BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(dedup.len(), got.len(), "a file was found twice");
    // One of the two names of the hard-linked inode.
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|p| want.contains(p) || p.ends_with("x0-again")));
    assert_eq!(r.skipped[&SkipReason::Symlink], 40);
    assert_eq!(r.skipped[&SkipReason::Empty], 40);
    assert_eq!(r.skipped[&SkipReason::Hardlink], 1);
    assert_eq!(r.skipped_dirs[&SkipReason::Nodedup], 1);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

/// A starting path that is a file is the only file found.
#[test]
fn a_file_as_starting_path() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("a"), b"data").unwrap();
    std::fs::write(d.path().join("b"), b"data").unwrap();
    let tree = Tree::open(&[d.path().join("a")]).unwrap();
    let policy = Policy::new(&[], None).unwrap();
    let stop = AtomicBool::new(false);
    let mut got = Vec::new();
    walk(&tree, FsKind::Other, &policy, &crate::progress::Silent, &stop, |c| got.push(c.path), || ());
    assert_eq!(got, vec![d.path().join("a")]);
}
