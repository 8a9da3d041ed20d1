//! The database's fingerprints must have been taken the way this run takes
//! them (block size, salted by owner or not); if not, everything is hashed
//! again.

use anyhow::Result;

use super::Job;
use crate::db::Db;
use crate::display::display_path;
use crate::progress::Progress;

/// A database hashed with another block size, or with fingerprints salted
/// otherwise (by owner or not, `--share-across-owners`), is hashed again
/// from scratch. Databases of builds before the salt have plain ones.
pub(super) fn check_fingerprints(job: &Job, db: &Db, progress: &dyn Progress) -> Result<()> {
    let block_size = job.scan.block_size.to_string();
    let salting = if job.scan.share_across_owners { SALT_NONE } else { SALT_BY_OWNER };
    if let Some(v) = db.upgraded_from.filter(|&v| v < crate::db::migrate::MAPS_DROPPED_AT) {
        progress.warn_run(&format!(
            "{}: upgraded from schema version {v}: block maps now keep 48-bit fingerprints, every file is hashed again",
            display_path(job.db_path)
        ));
    }
    let recorded = db.meta("block_size")?;
    let recorded_salting = db.meta(SALTING)?.unwrap_or_else(|| SALT_NONE.to_owned());
    let why = if recorded.as_deref() != Some(&block_size) {
        "block size differs from the database's"
    } else if recorded_salting != salting {
        "fingerprints were taken with another --share-across-owners setting"
    } else {
        return Ok(());
    };
    if recorded.is_some() {
        progress.warn_run(&format!("{}: {why}: every file is hashed again", display_path(job.db_path)));
    }
    db.forget_all_hashes()?;
    db.set_meta("block_size", &block_size)?;
    db.set_meta(SALTING, salting)?;
    Ok(())
}

/// Meta key: how the recorded fingerprints are salted ([`SALT_BY_OWNER`]
/// or [`SALT_NONE`]; see `hash::owner_salt`).
const SALTING: &str = "fingerprint_salt";
/// Each owner's fingerprints salted apart (the default).
const SALT_BY_OWNER: &str = "owner";
/// Plain fingerprints (`--share-across-owners`, and older databases).
const SALT_NONE: &str = "none";
