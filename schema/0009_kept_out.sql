-- Schema version 9: files a run kept out of its plan because another of
-- their hard links is outside the paths it scanned, or left out by policy
-- (skip reason hardlink_outside). `dedupscan report` plans without them, as
-- the run did, so that "not yet shared" is what the next run would submit,
-- not bytes no run will touch. Each run replaces the rows of the files it
-- saw; a row whose file is forgotten is dropped. Only files kept out have
-- rows.
CREATE TABLE kept_out (
    file_id INTEGER PRIMARY KEY,   -- files.id
    run     INTEGER NOT NULL       -- runs.id that kept it out last
);
