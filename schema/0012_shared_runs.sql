-- Schema version 12: where each file's blocks lie in extents FIEMAP showed
-- shared when the file was hashed (a reflinked clone, a snapshot, a file
-- deduplicated before). One row per file that has any: `runs` holds its
-- runs of blocks in shared extents, in file order, as LEB128 varints (gap
-- since the previous run's end, first physical block, blocks: see
-- `db::maps::encode_runs`); `salt` is the owner salt of its fingerprints.
-- The plan groups each shared physical block once per owner salt (the
-- file of lowest volume key and inode keeps it), so what is already shared costs
-- no grouping memory and is reported as already shared. A file
-- hashed before this version has no row and is grouped block by block, as
-- before, until it is hashed again: no rehash is needed. (IF NOT EXISTS:
-- a database set back to an older version by hand still upgrades.)
CREATE TABLE IF NOT EXISTS shared_runs (
    file_id INTEGER PRIMARY KEY,   -- files.id
    salt    INTEGER NOT NULL,      -- hash::owner_salt of its fingerprints
    runs    BLOB    NOT NULL
);
