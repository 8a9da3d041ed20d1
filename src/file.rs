//! What a file is to dedupscan: its row ([`FileId`]), its identity across
//! remounts ([`FileKey`]), and the facts change detection and sharing rely
//! on ([`FileFacts`]: path, size, time tags). Base vocabulary: the crawl
//! produces these facts, the database records them and gives them back, the
//! share phase checks a file against them before touching it.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use rusqlite::types::{FromSql, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rustix::fs::Stat;

/// Row id of a file in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct FileId(pub i64);

impl ToSql for FileId {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

impl FromSql for FileId {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        i64::column_result(value).map(FileId)
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Which file, in a way that survives a remount: the *volume key* (the
/// btrfs subvolume id; 0 on other filesystems, one database per
/// filesystem; see `sys::SubvolIds` and ARCHITECTURE.md "File identity")
/// and the inode number. Two names of one inode (hard links) have one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileKey {
    /// The volume key, not the raw `st_dev` (btrfs hands out a subvolume's
    /// `st_dev` in the order subvolumes are first touched after a mount).
    pub volume: u64,
    /// The inode number on that volume.
    pub ino: u64,
}

/// A 32-bit tag of a timestamp: all change detection asks of a time is
/// "equal or not", so the database keeps 4 bytes instead of 8. Signed, so
/// SQLite stores it in 4 bytes.
pub type TimeTag = i32;

/// The path of entry `name` of directory `dir`, as `Path::join` makes it,
/// in one allocation: `join` copies `dir` and then grows the copy for the
/// name, and the crawl and change detection make a path per file (on a
/// million files, path building was 15% of a no-change run's samples).
pub fn child_path(dir: &[u8], name: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    if name.first() == Some(&b'/') {
        // An absolute name replaces the path, as `join` has it.
        return PathBuf::from(std::ffi::OsString::from_vec(name.to_vec()));
    }
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.is_empty() && !dir.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    PathBuf::from(std::ffi::OsString::from_vec(p))
}

/// Tag of the time `sec`.`nsec`: the splitmix64 finaliser of its
/// nanoseconds, so every bit of the time moves every bit of the tag (a time
/// set back by a whole number of days changes the tag too).
pub fn time_tag(sec: i64, nsec: i64) -> TimeTag {
    let mut z = (sec as u64).wrapping_mul(1_000_000_000).wrapping_add(nsec as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 32) as u32 as i32
}

/// One regular file as the crawl found it or the database recorded it:
/// the one type for "this file, as we last saw it". Change detection
/// compares a found one with the recorded one; the share phase compares the
/// file it opens with the recorded one before sharing (any difference: the
/// file changed since it was hashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFacts {
    /// The path it was found at (or is recorded under).
    pub path: PathBuf,
    /// Its identity. Straight from the crawl, `key.volume` is still the raw
    /// `st_dev` (the crawl does not open files); change detection turns it
    /// into the volume key before anything is recorded or compared.
    pub key: FileKey,
    /// Size in bytes.
    pub size: u64,
    /// [`time_tag`] of the modification time.
    pub mtime: TimeTag,
    /// [`time_tag`] of the inode change time.
    pub ctime: TimeTag,
}

impl FileFacts {
    /// Build from `fstat` metadata, on the volume `volume` (a volume key,
    /// or `st_dev` straight from the crawl).
    pub fn from_metadata(path: PathBuf, volume: u64, m: &std::fs::Metadata) -> FileFacts {
        FileFacts {
            path,
            key: FileKey { volume, ino: m.ino() },
            size: m.size(),
            mtime: time_tag(m.mtime(), m.mtime_nsec()),
            ctime: time_tag(m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether the open file `f` is still this one as recorded (a regular
    /// file of the same volume key, inode, size, mtime and ctime): checked
    /// before a file is shared into or punched, and before each request.
    pub fn is_open_as_recorded(&self, f: &std::fs::File, keys: &mut crate::sys::SubvolIds) -> bool {
        f.metadata().is_ok_and(|m| {
            let key = keys.id_for(m.dev(), f);
            m.is_file() && FileFacts::from_metadata(self.path.clone(), key, &m) == *self
        })
    }

    /// Whether the open file `f`, of metadata `m`, is this one's inode
    /// (volume key and inode number), whatever its content now: what
    /// `report` measures. The volume key is asked once per `st_dev`
    /// (`keys`), not once per file.
    pub fn is_same_inode(&self, f: &std::fs::File, m: &std::fs::Metadata, keys: &mut crate::sys::SubvolIds) -> bool {
        m.ino() == self.key.ino && keys.id_for(m.dev(), f) == self.key.volume
    }

    /// Build from a raw `fstatat`/`fstat` result (the crawl's), on the
    /// volume `volume`.
    // The field types of `struct stat` differ by architecture.
    #[allow(clippy::unnecessary_cast)]
    pub fn from_stat(path: PathBuf, volume: u64, st: &Stat) -> FileFacts {
        FileFacts {
            path,
            key: FileKey { volume, ino: st.st_ino as u64 },
            size: st.st_size as u64,
            mtime: time_tag(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: time_tag(st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }
}

/// A file as the database recorded it, for change detection: its row, its
/// facts as recorded, and the run that hashed it. Defined here, below both
/// `changes` (which compares) and `db` (which reads it), so that neither
/// imports the other.
#[derive(Debug, Clone)]
pub struct Known {
    /// Its row.
    pub id: FileId,
    /// Path, key, size and time tags as recorded.
    pub file: FileFacts,
    /// The run that hashed it.
    pub hashed_run: i64,
}

/// A set of file ids as a bitset indexed by row id: row ids are dense
/// integers, so ten million files cost 1.25 MB (a `HashSet<FileId>` of them
/// would cost hundreds). What a run saw, and which files a plan may use,
/// are kept this way so that memory stays flat in the number of files.
#[derive(Debug, Clone, Default)]
pub struct IdSet {
    words: Vec<u64>,
}

impl IdSet {
    /// An empty set.
    pub fn new() -> IdSet {
        IdSet::default()
    }

    /// Add `id` (ids below 0 are not row ids and are ignored).
    pub fn insert(&mut self, id: FileId) {
        let Ok(i) = usize::try_from(id.0) else { return };
        if i / 64 >= self.words.len() {
            self.words.resize(i / 64 + 1, 0);
        }
        self.words[i / 64] |= 1 << (i % 64);
    }

    /// Remove `id`.
    pub fn remove(&mut self, id: FileId) {
        if let Some(w) = usize::try_from(id.0).ok().and_then(|i| self.words.get_mut(i / 64).map(|w| (w, i))) {
            *w.0 &= !(1 << (w.1 % 64));
        }
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: FileId) -> bool {
        usize::try_from(id.0).ok().and_then(|i| self.words.get(i / 64).map(|w| w >> (i % 64) & 1 == 1)) == Some(true)
    }

    /// How many ids the set holds.
    pub fn len(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The ids, in order.
    pub fn iter(&self) -> impl Iterator<Item = FileId> + '_ {
        let ones = |(w, &bits): (usize, &u64)| (0..64).filter(move |b| bits >> b & 1 == 1).map(move |b| w * 64 + b);
        self.words.iter().enumerate().flat_map(ones).map(|i| FileId(i as i64))
    }
}

impl FromIterator<FileId> for IdSet {
    fn from_iter<I: IntoIterator<Item = FileId>>(iter: I) -> IdSet {
        let mut s = IdSet::new();
        iter.into_iter().for_each(|id| s.insert(id));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_child_path_is_what_join_makes() {
        for (dir, name) in
            [("/v/d", "f"), ("/v/d/", "f"), ("/", "f"), ("", "f"), ("/v", ""), ("/v", "/abs"), ("d", "a b")]
        {
            let joined = Path::new(dir).join(name);
            assert_eq!(child_path(dir.as_bytes(), name.as_bytes()), joined, "{dir:?} + {name:?}");
        }
    }

    #[test]
    fn time_tags_tell_times_apart() {
        let t = time_tag(1_700_000_000, 123);
        assert_eq!(t, time_tag(1_700_000_000, 123));
        assert_ne!(t, time_tag(1_700_000_000, 124));
        // Whole seconds set back by 2^23 s (97 days) agree in the low 32 bits
        // of their nanoseconds; the tag must still differ.
        let (a, b) = (1_700_000_000i64, 1_700_000_000i64 - (1 << 23));
        assert_eq!((a * 1_000_000_000) as u32, (b * 1_000_000_000) as u32);
        assert_ne!(time_tag(a, 0), time_tag(b, 0));
    }

    #[test]
    fn id_sets_hold_dense_row_ids() {
        let mut s: IdSet = [FileId(1), FileId(64), FileId(200)].into_iter().collect();
        assert!(s.contains(FileId(64)) && !s.contains(FileId(63)) && !s.contains(FileId(10_000)));
        assert!(!s.contains(FileId(-1)));
        s.remove(FileId(64));
        s.remove(FileId(1 << 40));
        assert_eq!((s.len(), s.contains(FileId(64)), s.contains(FileId(200))), (2, false, true));
    }
}
