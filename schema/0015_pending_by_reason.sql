-- Schema version 15: a file may be pending for its sharing and for its
-- written zeros at once; the holder of a file's zeros is retried when it
-- changes, not only when it is gone.
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

-- 2. zeros_held: the holder's inode generation and change time when found
-- (its btrfs inode item). The next run tries the file again once these
-- differ: the holder was rewritten in place (it may no longer hold the
-- extent), lost its user.nodedup flag, or its inode number was taken by a
-- new file. NULL (rows from version 14): tried again once, then recorded.
-- Rebuilt rather than altered, like pending above, so that this step also
-- runs on tables already in this form (tests mark a current database
-- older to go through the upgrade).
CREATE TABLE zeros_held_v15 (
    file_id    INTEGER PRIMARY KEY,   -- files.id of the file left pending
    root       INTEGER NOT NULL,      -- subvolume id of the holder outside
    ino        INTEGER NOT NULL,      -- its inode there
    run        INTEGER NOT NULL,      -- runs.id that found it
    generation INTEGER,               -- its inode item's generation then
    ctime_ns   INTEGER                -- and change time, in nanoseconds
);
INSERT INTO zeros_held_v15 (file_id, root, ino, run) SELECT file_id, root, ino, run FROM zeros_held;
DROP TABLE zeros_held;
ALTER TABLE zeros_held_v15 RENAME TO zeros_held;
