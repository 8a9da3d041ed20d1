//! The files a run shared ranges from (`schema/0016_sources.sql`): what a
//! later plan prefers as sources (see `plan::claims`).

use std::collections::BTreeSet;

use super::Db;
use crate::file::{FileId, IdSet};

impl Db {
    /// Record that ranges were shared from the files `ids`. Rows of files
    /// forgotten meanwhile are not written.
    pub fn mark_sources(&self, ids: &BTreeSet<FileId>) -> rusqlite::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut ins =
                tx.prepare_cached("INSERT OR IGNORE INTO sources (file_id) SELECT id FROM files WHERE id = ?1")?;
            for id in ids {
                ins.execute([id])?;
            }
        }
        tx.commit()
    }

    /// The files ranges were shared from, among those `keep` accepts. A
    /// database opened read-only by `report` before version 16: none.
    pub fn sources(&self, keep: impl Fn(FileId) -> bool) -> rusqlite::Result<IdSet> {
        let mut out = IdSet::new();
        let exists: bool = self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sources')",
            [],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(out);
        }
        let mut st = self.conn.prepare_cached("SELECT file_id FROM sources")?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            let id: FileId = r.get(0)?;
            if keep(id) {
                out.insert(id);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_recorded_once_and_only_for_known_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), "uuid").unwrap();
        db.conn
            .execute_batch(
                "INSERT INTO dirs (id, dev, path) VALUES (1, 7, x'2f61');
                 INSERT INTO files VALUES (1, 1, x'61', 10, 8192, 0, 0, 1, x''), (2, 1, x'62', 11, 8192, 0, 0, 1, x'');",
            )
            .unwrap();
        db.mark_sources(&[FileId(1), FileId(9)].into()).unwrap();
        db.mark_sources(&[FileId(1), FileId(2)].into()).unwrap();
        let all: Vec<FileId> = db.sources(|_| true).unwrap().iter().collect();
        assert_eq!(all, vec![FileId(1), FileId(2)]);
        let kept: Vec<FileId> = db.sources(|id| id != FileId(1)).unwrap().iter().collect();
        assert_eq!(kept, vec![FileId(2)]);
        db.forget_all_hashes().unwrap();
        assert!(db.sources(|_| true).unwrap().is_empty());
    }
}
