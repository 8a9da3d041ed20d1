-- Schema version 2: remember which run hashed each file, so an incremental
-- run plans only around files that are new since the last complete sharing
-- run (everything older was already matched and shared).
ALTER TABLE files ADD COLUMN hashed_run INTEGER NOT NULL DEFAULT 0;
CREATE INDEX files_hashed_run ON files (hashed_run);
