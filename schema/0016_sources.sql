-- Schema version 16: the files a run shared ranges from. Their extents
-- then hold other files' blocks too, but sharing changes neither file's
-- times, so neither is hashed again and `shared_runs` (taken when each
-- was hashed) does not say so. A later plan prefers these files as
-- sources (`plan::claims`): made a destination, a file whose extent
-- other files keep frees nothing. A row goes when its file is hashed
-- again or forgotten; files of one block are not recorded.
CREATE TABLE IF NOT EXISTS sources (
    file_id INTEGER PRIMARY KEY    -- files.id
);
