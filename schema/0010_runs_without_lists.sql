-- Schema version 10: a run's stored report no longer carries its `--list`
-- (a list is as long as the plan: FULL's made one row 27 MB, and `report`
-- and the metrics file read every run's report back). Reports stored with
-- one lose it here; their numbers stay. The freed pages are reused by later
-- writes (no VACUUM: it would rewrite the whole file).
UPDATE runs SET report = json_remove(report, '$.ranges')
 WHERE report IS NOT NULL AND json_valid(report) AND json_type(report, '$.ranges') IS NOT NULL;
