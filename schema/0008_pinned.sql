-- Schema version 8: what the shared bytes of each file pin (btrfs, issue 13).
-- A destination's bytes shared into an extent that stays on disk for an
-- uncovered rest of the same file free nothing. A run records them here per
-- file and reason (below_rewrite_ratio, compressed, inline, not_rewritable,
-- rewrite_failed), so `dedupscan report` can say which files hold space the
-- sharing did not free. Only files with pinned bytes have rows. A file's rows
-- are replaced when a later run judges its extents again, and are void once
-- the file changed (its ctime tag differs from the one stored here) or is
-- forgotten.
CREATE TABLE pinned (
    file_id INTEGER NOT NULL,   -- files.id of the destination
    reason  TEXT    NOT NULL,   -- see above
    bytes   INTEGER NOT NULL,   -- shared bytes that freed nothing
    ctime   INTEGER NOT NULL,   -- files.ctime when recorded
    run     INTEGER NOT NULL,   -- runs.id that recorded it
    PRIMARY KEY (file_id, reason)
) WITHOUT ROWID;
