-- Schema version 6: no anchors table.
-- Planning has grouped every block of every file by fingerprint, straight
-- from the block maps, since the exact block groups replaced sampling
-- (plan/group.rs); the sampled anchors were still written on every hash
-- and deleted on every rehash, but never read. Dropping them costs nothing
-- to rebuild. The freed pages are reused by later writes; `VACUUM` returns
-- them to the filesystem (not done here: it rewrites the whole file).
DROP TABLE anchors;
