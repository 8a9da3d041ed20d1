//! dedupscan: find data stored twice on btrfs and XFS and let the kernel
//! share it with `FIDEDUPERANGE`.
//!
//! The pipeline, one module per stage (see `docs/ARCHITECTURE.md`):
//! [`walk`] (with [`policy`]) → [`hash`] → [`changes`] → [`db`] → [`plan`] →
//! [`dedupe`] → [`report`], driven by [`pipeline`] (configured once by
//! [`config`]). All ioctls and `unsafe` live in [`sys`].
#![warn(missing_docs)]

pub mod batched;
pub mod blockmap;
pub mod changes;
pub mod cli;
pub mod config;
pub mod corpus;
pub mod db;
pub mod dedupe;
pub mod display;
pub mod errors;
pub mod exit;
pub mod file;
pub mod hash;
pub mod html;
pub mod metrics;
pub mod pipeline;
pub mod plan;
pub mod policy;
pub mod progress;
pub mod report;
pub mod summary;
pub mod sys;
pub mod walk;
