-- Schema version 15: a file may be pending for its sharing and for its
-- written zeros at once. The pending table was keyed by file alone, so a
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
