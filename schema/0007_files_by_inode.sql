-- Schema version 7: files found by inode with an index, not a map in memory.
-- Change detection used to load every known file (a path each) before the
-- crawl: 369 MB for a million files. Now the crawl asks for each file it
-- finds by (volume key, inode), and the run keeps only a bitset of the ids
-- it saw (issue 14: memory flat in the number of files). About 12 bytes per
-- file.
CREATE INDEX files_inode ON files (ino);
