//! `cargo run --example make_corpus -- DIR [SEED] [SCALE]`: write the
//! synthetic test corpus (see `dedupscan::corpus`) into DIR.

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: make_corpus DIR [SEED] [SCALE]");
        std::process::exit(2);
    };
    let seed = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let scale = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    if let Err(e) = dedupscan::corpus::build(std::path::Path::new(&dir), seed, scale) {
        eprintln!("make_corpus: {dir}: {e}");
        std::process::exit(1);
    }
}
