//! Thin, safe wrappers over the Linux interfaces dedupscan needs.
//!
//! Every `unsafe` block and every ioctl of the project lives below this module,
//! each behind a small safe function with a `// SAFETY:` note. Nothing here
//! knows about the pipeline: callers pass file descriptors and get plain Rust
//! values back.

pub mod beneath;
pub mod btrfs_names;
pub mod btrfs_tree;
pub mod dedupe;
pub mod fiemap;
pub mod fs;
pub mod inode;
pub mod limits;
pub mod mounts;
pub mod qgroup;
pub mod resolve;
pub mod spill;
pub mod stat;
pub mod twins;
pub mod watch;

pub use dedupe::{dedupe_range, DedupeStatus, DestResult};
pub use fiemap::{fiemap, Extent};
pub use fs::{commit, fs_info, space, start_writeback, syncfs, volume_key, FsInfo, FsKind, SubvolIds};
pub use inode::{inode_flags, open_readonly, InodeFlags};
