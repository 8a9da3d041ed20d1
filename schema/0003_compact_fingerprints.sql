-- Schema version 3: a smaller database.
--  * Block maps keep 4 bytes per block (the high half of the 64-bit
--    fingerprint), with runs of zero blocks and holes run-length encoded.
--  * Anchors are sampled 1 block in 16 (chosen from the 4 bytes the block
--    map keeps, so they can be found again and deleted by key range), still
--    keyed by the full 64-bit fingerprint.
--  * Whole-file digests are 16 bytes.
--  * The (dev, ino) index was never queried: dropped.
-- Old block maps cannot be converted to the new sampling: fingerprints are
-- dropped and every file is hashed once more by the next run. The history
-- of runs is kept.
DELETE FROM anchors;
DELETE FROM files;
DROP INDEX files_inode;
DELETE FROM meta WHERE key = 'last_complete_share_run';
