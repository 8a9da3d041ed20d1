-- Schema version 15: a file may be pending for its sharing and for its
-- written zeros at once; the holders of a file's zeros are retried when
-- one changes, not only when it is gone.
--
-- 1. pending, by file and reason. The pending table was keyed by file alone, so a
-- destination left pending for its sharing (say referenced_outside_run,
-- 64 KiB) hid the zeros the zero pass left in it (zeros_referenced_outside_run,
-- 15 MiB): the retry still worked (zeros_held), but the report under-counted.
-- Now one row per file and reason: the share phase replaces only its own
-- reasons' rows of the files it went through, the zero pass only its own.
CREATE TABLE pending_by_reason (
    file_id INTEGER NOT NULL,      -- files.id of the destination
    reason  TEXT    NOT NULL,      -- dedupe::Pending::name
    bytes   INTEGER NOT NULL,      -- bytes left: planned, or of zeros
    run     INTEGER NOT NULL,      -- runs.id that left it pending
    PRIMARY KEY (file_id, reason)
) WITHOUT ROWID;
INSERT INTO pending_by_reason (file_id, reason, bytes, run) SELECT file_id, reason, bytes, run FROM pending;
DROP TABLE pending;
ALTER TABLE pending_by_reason RENAME TO pending;

-- 2. zeros_held: the holders outside the run, one row each, with their
-- inode generation and change time when found (their btrfs inode item).
-- Keyed by file and holder: a file whose extents of zeros have different
-- newest holders (one clone outside holds one region, another the next)
-- records each, so the one that lets go first is seen. The next run tries
-- the file again once one of them is gone or changed: rewritten in place
-- (it may no longer hold the extent), its user.nodedup lost, or its inode
-- number taken by a new file. NULL (rows from version 14): tried again
-- once, then recorded. Rebuilt rather than altered, like pending above, so
-- that this step also runs on tables already in this form (tests mark a
-- current database older to go through the upgrade).
CREATE TABLE zeros_held_v15 (
    file_id    INTEGER NOT NULL,      -- files.id of the file left pending
    root       INTEGER NOT NULL,      -- subvolume id of a holder outside
    ino        INTEGER NOT NULL,      -- its inode there
    run        INTEGER NOT NULL,      -- runs.id that found it
    generation INTEGER,               -- its inode item's generation then
    ctime_ns   INTEGER,               -- and change time, in nanoseconds
    PRIMARY KEY (file_id, root, ino)
) WITHOUT ROWID;
INSERT INTO zeros_held_v15 (file_id, root, ino, run) SELECT file_id, root, ino, run FROM zeros_held;
DROP TABLE zeros_held;
ALTER TABLE zeros_held_v15 RENAME TO zeros_held;
