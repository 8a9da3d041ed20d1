-- Schema version 14: who keeps a file's written zeros (btrfs). A file whose
-- zeros share an extent with a file outside the run (a read-only snapshot,
-- a clone outside the starting paths, excluded or user.nodedup) is left
-- pending, reason zeros_referenced_outside_run; this table names the
-- newest such holder found, by subvolume id and inode. The next run,
-- incremental or not, tries the file again once that holder is gone
-- (BTRFS_IOC_INO_LOOKUP finds no name), and not every night while it
-- stays: a snapshot taken after the file last changed holds it for as long
-- as it is kept. The holder is recorded even when the file's pending row is
-- the sharing's (one row per file; referenced_outside_run waits for FIEMAP
-- to show no extent shared, which never comes while clones in the run
-- share them). A run that visits the file's zeros again replaces its row;
-- rows of files forgotten are dropped.
CREATE TABLE IF NOT EXISTS zeros_held (
    file_id INTEGER PRIMARY KEY,   -- files.id of the file left pending
    root    INTEGER NOT NULL,      -- subvolume id of the holder outside
    ino     INTEGER NOT NULL,      -- its inode there
    run     INTEGER NOT NULL       -- runs.id that found it
);
