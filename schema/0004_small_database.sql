-- Schema version 4: a database about three times smaller (docs/BENCHMARKS.md).
--  * Paths: a table of directories (with the st_dev their files are on);
--    each file keeps only its name. Directories without files are dropped.
--  * Times: 32-bit tags of mtime and ctime (a mix of the nanoseconds).
--    Change detection only asks "equal or not"; a false "equal" has odds of
--    2^-32 per changed file and can only cost a missed match, because the
--    kernel compares every byte before it shares anything.
--  * No whole-file digest and no index on content: whole-file duplicates are
--    grouped in memory at plan time, by size and a hash of the block map,
--    in the same pass that finds each file's smallest-fingerprint anchor.
--  * Anchors: only the sampled ones (1 block in 16), keyed by the 32-bit
--    block-map fingerprint.
--  * Copies share one block map (see files.blocks).
--  * No index on hashed_run: the index of known files loaded at the start
--    of every run carries it.
-- Old rows cannot be converted (names and tags differ): fingerprints are
-- dropped and every file is hashed once more by the next run. The history
-- of runs is kept.
DROP TABLE anchors;
DROP TABLE files;
DELETE FROM meta WHERE key = 'last_complete_share_run';

CREATE TABLE dirs (
    id   INTEGER PRIMARY KEY,
    dev  INTEGER NOT NULL,
    path BLOB    NOT NULL      -- absolute, raw bytes
);

CREATE TABLE files (
    id         INTEGER PRIMARY KEY,
    dir        INTEGER NOT NULL,   -- dirs.id
    name       BLOB    NOT NULL,
    ino        INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    mtime      INTEGER NOT NULL,   -- 32-bit tag
    ctime      INTEGER NOT NULL,   -- 32-bit tag
    hashed_run INTEGER NOT NULL,
    -- 4 bytes per block (the block-map fingerprint), runs of zero blocks
    -- and holes run-length encoded. Or, as an INTEGER, the id of a file of
    -- the same size and block map that holds the map ("twin"): a copy of
    -- a file of 16 or more blocks does not store its map twice. A holder
    -- that is rehashed or removed hands its map to one of its twins first.
    blocks     BLOB    NOT NULL
);
CREATE INDEX files_twins ON files (blocks) WHERE typeof(blocks) = 'integer';

CREATE TABLE anchors (
    fp      INTEGER NOT NULL,
    file_id INTEGER NOT NULL,
    blk     INTEGER NOT NULL,
    PRIMARY KEY (fp, file_id, blk)
) WITHOUT ROWID;
