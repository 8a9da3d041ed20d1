-- dedupscan database, schema version 1.
-- One database describes one filesystem. Paths are stored as raw bytes so
-- that names that are not UTF-8 survive unchanged.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- One row per inode (hard links are one row). `dev` is the st_dev the file
-- was seen under (on btrfs, one per subvolume).
CREATE TABLE files (
    id       INTEGER PRIMARY KEY,
    dev      INTEGER NOT NULL,
    ino      INTEGER NOT NULL,
    path     BLOB    NOT NULL,
    size     INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    -- SHA-256 over the size and every block's SHA-256.
    digest   BLOB    NOT NULL,
    -- Compact block map: 8 bytes (little-endian fingerprint) per block,
    -- 0 for holes and all-zero blocks.
    blocks   BLOB    NOT NULL
);
CREATE UNIQUE INDEX files_inode ON files (dev, ino);
CREATE INDEX files_content ON files (size, digest);

-- Sampled, content-defined block fingerprints: a block is an anchor when its
-- fingerprint falls in a fixed fraction of the hash space (plus each file's
-- smallest), so identical blocks are sampled alike everywhere. A match on an
-- anchor is extended through the block maps.
CREATE TABLE anchors (
    fp      INTEGER NOT NULL,
    file_id INTEGER NOT NULL,
    blk     INTEGER NOT NULL,
    PRIMARY KEY (fp, file_id, blk)
) WITHOUT ROWID;

-- History: one row per run, with the run's report as JSON.
CREATE TABLE runs (
    id          INTEGER PRIMARY KEY,
    started_at  INTEGER NOT NULL,   -- unix seconds
    finished_at INTEGER,
    command     TEXT    NOT NULL,
    dry_run     INTEGER NOT NULL,
    report      TEXT
);
