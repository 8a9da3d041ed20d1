//! Regenerate the man page and the shell completions from the clap
//! definitions:
//!
//! ```text
//! cargo run --example gen_docs
//! ```
//!
//! `tests/packaging.rs` fails when the committed files differ from what this
//! writes.

mod docs;

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in docs::generate() {
        let path = root.join(&file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if std::fs::read(&path).ok().as_deref() == Some(file.contents.as_slice()) {
            println!("unchanged {}", file.path.display());
        } else {
            std::fs::write(&path, &file.contents)?;
            println!("wrote     {}", file.path.display());
        }
    }
    Ok(())
}
