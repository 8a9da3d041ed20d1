-- Schema version 13: files whose block map is larger than this build
-- handles (error kind too_large: about 610 GiB of data in one file with
-- 4 KiB blocks, see `blockmap::MAX_MAP_BYTES`). Such a file is read up to
-- that point before it is refused; without this table every run read it
-- again, a VM image store's nightly run reading hundreds of GiB for
-- nothing. A run that finds the file as it was recorded here (same volume
-- key, inode, size and time tags) refuses it without opening it, and says
-- so; a changed file is read again. `--rehash` reads every file again. A
-- complete run drops the rows below its starting paths that it did not
-- confirm. One row per file refused: none on most volumes.
CREATE TABLE IF NOT EXISTS too_large (
    dev    INTEGER NOT NULL,   -- volume key
    ino    INTEGER NOT NULL,
    size   INTEGER NOT NULL,   -- bytes, as refused
    mtime  INTEGER NOT NULL,   -- time tag, as refused
    ctime  INTEGER NOT NULL,   -- time tag, as refused
    path   BLOB    NOT NULL,   -- where it was found (for pruning, messages)
    run    INTEGER NOT NULL,   -- runs.id that refused it after reading it
    PRIMARY KEY (dev, ino)
) WITHOUT ROWID;
