-- Schema version 5: filesystem state that must survive a remount or a full
-- disk.
--  * dirs.dev holds a *volume key* instead of st_dev: on btrfs the id of the
--    subvolume (st_dev is handed out to subvolumes in the order they are
--    first touched after mount), elsewhere 0 (one database per filesystem).
--    Existing rows are converted by db/migrate.rs right after this script,
--    in the same transaction, by looking at each stored st_dev's
--    directories on the mounted volume; a st_dev it cannot prove is marked
--    (top bit set) so its files are hashed again rather than mistaken.
--  * pending: destinations whose sharing failed for lack of space (ENOSPC,
--    EDQUOT) or was not attempted because a file outside the run (a
--    read-only snapshot) keeps their extents, so the next run, incremental
--    or not, plans them again.
CREATE TABLE pending (
    file_id INTEGER PRIMARY KEY,   -- files.id of the destination
    reason  TEXT    NOT NULL,      -- no_space_rewrite, no_space_share, referenced_outside_run
    bytes   INTEGER NOT NULL,      -- bytes planned into it that were not shared
    run     INTEGER NOT NULL       -- runs.id that left it pending
);
