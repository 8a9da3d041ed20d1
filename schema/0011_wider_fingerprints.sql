-- Schema version 11: block maps keep 6 bytes per block (the high 48 bits
-- of the 64-bit fingerprint) instead of 4. The planner groups every block
-- outside whole-file copies by this value; with 32 bits, N distinct blocks
-- gave about N²/2³³ false pairs (~8 million at 1 TiB), each a refused
-- request and a link joining unrelated files into one planning component.
-- Old maps cannot be widened without the data: they are dropped, and every
-- file is hashed once more by the next run (as a new block size would).
-- What the old maps said about pinned bytes and files kept out goes with
-- them; the history of runs is kept.
DELETE FROM pinned;
DELETE FROM kept_out;
DELETE FROM files;
DELETE FROM dirs;
DELETE FROM meta WHERE key = 'last_complete_share_run';
