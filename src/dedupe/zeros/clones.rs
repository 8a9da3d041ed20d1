//! btrfs: the zeros of an extent that reflinked clones share, with data in
//! it too (a thick image written in one pass, then copied with `cp`).
//!
//! btrfs frees an extent only when nothing references any of it, so no
//! holder can let go of its zeros alone: each must also stop referencing
//! the extent's data. Holder by holder, each would rewrite the data into
//! an extent of its own, and the copies would cost what the zeros free; a
//! holder with no zeros in it (a copy the share phase shared from it)
//! would never let go at all. So all the holders go together ([`plan`]):
//! the data is copied once, out of the first holder that needs it, into a
//! fresh extent, and shared from there into every other holder (the kernel
//! compares every byte); every holder's zeros are turned into holes. The
//! old extent is then referenced by nothing and freed; the copy costs the
//! data once, as the rewrite of an extent held by one file does, and the
//! same `--rewrite-ratio` weighs it.
//!
//! Everything is counted in offsets into the extent: every holder's
//! stretch of it reads the same bytes there, whatever its place in its
//! file.

use std::collections::BTreeMap;

/// One holder's stretch of the extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Which holder (an index into the caller's list of files).
    pub holder: usize,
    /// Where the stretch begins in the holder's file.
    pub file: u64,
    /// Where it begins in the extent.
    pub at: u64,
    /// Its length, in bytes.
    pub len: u64,
}

/// One step of the work, done in order; any that does not go through
/// stops the rest (the extent then stays, and no byte has changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Rewrite the byte ranges `parts` of `holder`'s file into a fresh
    /// extent (copied out and shared back: `zeros::rewrite`).
    Copy {
        /// Whose file.
        holder: usize,
        /// Sorted byte ranges of it.
        parts: Vec<(u64, u64)>,
    },
    /// Share `len` bytes at `from_at` in holder `from`'s file (copied by an
    /// earlier step) into `to_at` in holder `to`'s.
    Share {
        /// The file shared from.
        from: usize,
        /// Where in it.
        from_at: u64,
        /// The file shared into.
        to: usize,
        /// Where in it.
        to_at: u64,
        /// How many bytes.
        len: u64,
    },
    /// Turn the byte ranges `parts` of `holder`'s file into holes.
    Punch {
        /// Whose file.
        holder: usize,
        /// Sorted byte ranges of it.
        parts: Vec<(u64, u64)>,
    },
}

/// The work on one extent, and what it comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClonesWork {
    /// What to do, in order.
    pub steps: Vec<Step>,
    /// The parts of the extent that become holes in every holder, as
    /// sorted `(offset into it, length)`.
    pub zeros: Vec<(u64, u64)>,
    /// Bytes of the extent copied once.
    pub data: u64,
}

/// The bytes a zero run must hold for each stretch of the extent it lies
/// strictly inside: its hole splits that stretch's item in two, one item
/// of metadata more (on btrfs about 350 bytes, DUP metadata counted
/// twice: 300 clones of an image with zero runs of 64 KiB grew the
/// metadata by 6.3 MiB to free 4 MiB of data). At 2 KiB a cut the items
/// cost at most about a sixth of what the run frees. A hole at the end of
/// a stretch only shortens its item, and one over a whole stretch drops it.
pub const BYTES_PER_CUT: u64 = 2 * 1024;

/// Why [`plan`] leaves an extent as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unworthy {
    /// A stretch not in whole blocks (a partial last block can only be
    /// shared at the end of both files), or a holder's runs not given.
    Cannot,
    /// No data in it: each holder lets go of its zeros alone.
    NoData,
    /// Zeros under `min`, counting only runs long enough for the items
    /// their holes cut ([`BYTES_PER_CUT`]).
    FewZeros,
    /// Data over `ratio` times the zeros: its copy would cost more.
    MuchData,
    /// Stretches over [`super::MAX_COMPARED_PER_ZERO`] times the zeros.
    ManyHolders,
}

impl Unworthy {
    /// What to say of an extent left so (with `-v`), if anything: with no
    /// data in it, each holder lets go alone, so nothing is left.
    pub fn said(self) -> Option<String> {
        Some(match self {
            Unworthy::NoData => return None,
            Unworthy::Cannot => "a stretch of it is not in whole blocks".to_owned(),
            Unworthy::FewZeros => {
                "its zero runs are too short for the metadata their holes would add to every clone".to_owned()
            }
            Unworthy::MuchData => "copying its data would cost more than --rewrite-ratio allows for the zeros \
                                   worth a hole in every clone"
                .to_owned(),
            Unworthy::ManyHolders => format!(
                "held by so many clones that the kernel would compare over {} times the zeros freed",
                super::MAX_COMPARED_PER_ZERO
            ),
        })
    }
}

/// The work that frees the extent its holders hold in `held` (every
/// stretch of every holder, holder 0 first), given each holder's zero runs
/// (`zeros[holder]`: sorted byte ranges of its file, whole `block`s). Its
/// zeros are the parts any holder's runs cover, in pieces of at least
/// `min` bytes, and of [`BYTES_PER_CUT`] for each stretch they cut
/// (shorter ones are copied with the data: they would only split the
/// items); its data, the rest any holder holds. A holder's own runs may be
/// cut short by its writes in place (a clone's): another holder's runs
/// cover the pieces.
/// Nothing to do this way, and why ([`Unworthy`]).
pub fn plan(
    held: &[Held],
    zeros: &[Vec<(u64, u64)>],
    block: u64,
    min: u64,
    ratio: f64,
) -> Result<ClonesWork, Unworthy> {
    if held.iter().any(|h| h.at % block != 0 || h.len % block != 0 || h.file % block != 0) {
        return Err(Unworthy::Cannot);
    }
    let (mut zero, mut covered) = (BTreeMap::new(), BTreeMap::new());
    for h in held {
        crate::dedupe::add_span(&mut covered, h.at, h.at + h.len);
        for (o, l) in super::zeros_in(zeros.get(h.holder).ok_or(Unworthy::Cannot)?, h.file, h.file + h.len, block) {
            let at = h.at + (o - h.file);
            crate::dedupe::add_span(&mut zero, at, at + l);
        }
    }
    zero.retain(|&s, &mut e| e - s >= min);
    let mut cuts_of = cuts(&zero, held).into_iter();
    // In ascending order, as `cuts` counted them.
    zero.retain(|&s, &mut e| e - s >= cuts_of.next().unwrap_or(0) as u64 * BYTES_PER_CUT);
    let zero_bytes: u64 = zero.iter().map(|(s, e)| e - s).sum();
    let data = covered.iter().map(|(s, e)| e - s).sum::<u64>() - zero_bytes;
    let compared: u64 = held.iter().map(|h| h.len).sum();
    match () {
        _ if data == 0 => return Err(Unworthy::NoData),
        _ if zero_bytes < min => return Err(Unworthy::FewZeros),
        _ if data as f64 > ratio * zero_bytes as f64 => return Err(Unworthy::MuchData),
        _ if compared > zero_bytes.saturating_mul(super::MAX_COMPARED_PER_ZERO) => return Err(Unworthy::ManyHolders),
        _ => {}
    }
    let mut homes = Homes::default();
    let mut steps = Vec::new();
    let mut sorted = held.to_vec();
    sorted.sort_unstable_by_key(|h| (h.holder, h.at));
    for mine in sorted.chunk_by(|a, b| a.holder == b.holder) {
        let holder = mine[0].holder;
        let (mut copy, mut shares, mut punch) = (Vec::new(), Vec::new(), Vec::new());
        for h in mine {
            for (a, b, is_zero) in cut(&zero, h.at, h.at + h.len) {
                let in_file = |x: u64| h.file + (x - h.at);
                if is_zero {
                    punch.push((in_file(a), b - a));
                    continue;
                }
                for (x, y, home) in homes.cut(a, b) {
                    match home {
                        Some((from, from_at)) => {
                            shares.push(Step::Share { from, from_at, to: holder, to_at: in_file(x), len: y - x })
                        }
                        None => copy.push((in_file(x), y - x)),
                    }
                }
                homes.add(a, b, holder, in_file(a));
            }
        }
        if !copy.is_empty() {
            copy.sort_unstable();
            steps.push(Step::Copy { holder, parts: copy });
        }
        steps.extend(shares);
        if !punch.is_empty() {
            punch.sort_unstable();
            steps.push(Step::Punch { holder, parts: punch });
        }
    }
    Ok(ClonesWork { steps, zeros: zero.iter().map(|(&s, &e)| (s, e - s)).collect(), data })
}

impl ClonesWork {
    /// The bytes of the extent that become holes: freed once all is done.
    pub fn zero_bytes(&self) -> u64 {
        self.zeros.iter().map(|z| z.1).sum()
    }
}

/// `[from, to)` cut at the edges of the `zero` spans: `(start, end, zero)`.
fn cut(zero: &BTreeMap<u64, u64>, from: u64, to: u64) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    let mut at = from;
    let first = zero.range(..=from).next_back().map_or(from, |(&s, _)| s);
    for (&s, &e) in zero.range(first..to) {
        let (s, e) = (s.max(from), e.min(to));
        if e <= s {
            continue;
        }
        if s > at {
            out.push((at, s, false));
        }
        out.push((s, e, true));
        at = e;
    }
    if at < to {
        out.push((at, to, false));
    }
    out
}

/// A piece of the extent: where it begins and ends, and where its data
/// is (the holder and the file offset of its start), if anywhere yet.
type Piece = (u64, u64, Option<(usize, u64)>);

/// Where the extent's data is once copied: spans of it (start → end), each
/// with the holder and the file offset of its start.
#[derive(Default)]
struct Homes(BTreeMap<u64, (u64, usize, u64)>);

impl Homes {
    /// `[from, to)` cut at the edges of the homes: `(start, end, home)`,
    /// with the holder and file offset of `start` where a home has it.
    fn cut(&self, from: u64, to: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut at = from;
        let first = self.0.range(..=from).next_back().map_or(from, |(&s, _)| s);
        for (&s, &(e, holder, file)) in self.0.range(first..to) {
            let (x, y) = (s.max(from), e.min(to));
            if y <= x {
                continue;
            }
            if x > at {
                out.push((at, x, None));
            }
            out.push((x, y, Some((holder, file + (x - s)))));
            at = y;
        }
        if at < to {
            out.push((at, to, None));
        }
        out
    }

    /// Record that `[from, to)` is at `file` in `holder`'s file from now
    /// on, where no home has it yet.
    fn add(&mut self, from: u64, to: u64, holder: usize, file: u64) {
        for (x, y, home) in self.cut(from, to) {
            if home.is_none() {
                self.0.insert(x, (y, holder, file + (x - from)));
            }
        }
    }
}

/// For each of the `zero` spans (disjoint, by start), how many stretches
/// of `held` it lies strictly inside. Each stretch adds one to the spans
/// between its ends: a difference array, a binary search a stretch.
fn cuts(zero: &BTreeMap<u64, u64>, held: &[Held]) -> Vec<usize> {
    let spans: Vec<(u64, u64)> = zero.iter().map(|(&s, &e)| (s, e)).collect();
    let mut diff = vec![0isize; spans.len() + 1];
    for h in held {
        // Disjoint spans are sorted by their ends too.
        let i = spans.partition_point(|&(s, _)| s <= h.at);
        let j = spans.partition_point(|&(_, e)| e < h.at + h.len);
        if i < j {
            diff[i] += 1;
            diff[j] -= 1;
        }
    }
    let mut n = 0;
    diff[..spans.len()]
        .iter()
        .map(|d| {
            n += d;
            n as usize
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Unworthy::*;
    use super::*;

    const K: u64 = 1024;
    const M: u64 = K * K;

    fn held(holder: usize, file: u64, at: u64, len: u64) -> Held {
        Held { holder, file, at, len }
    }

    #[test]
    fn an_image_and_its_clone_copy_the_data_once_and_punch_the_zeros_in_both() {
        // An 8 MiB extent: 1 MiB data, 1 MiB zeros, four times over; the
        // image holds it at 0, its clone at 16 MiB.
        let zeros: Vec<(u64, u64)> = (0..4).map(|i| (i * 2 * M + M, M)).collect();
        let clone_zeros: Vec<(u64, u64)> = zeros.iter().map(|&(o, l)| (o + 16 * M, l)).collect();
        let w = plan(
            &[held(0, 0, 0, 8 * M), held(1, 16 * M, 0, 8 * M)],
            &[zeros.clone(), clone_zeros.clone()],
            4 * K,
            64 * K,
            4.0,
        )
        .unwrap();
        assert_eq!((w.zero_bytes(), w.data), (4 * M, 4 * M));
        let data: Vec<(u64, u64)> = (0..4).map(|i| (i * 2 * M, M)).collect();
        let mut want = vec![Step::Copy { holder: 0, parts: data.clone() }, Step::Punch { holder: 0, parts: zeros }];
        want.extend(data.iter().map(|&(o, l)| Step::Share { from: 0, from_at: o, to: 1, to_at: o + 16 * M, len: l }));
        want.push(Step::Punch { holder: 1, parts: clone_zeros });
        assert_eq!(w.steps, want);
    }

    #[test]
    fn a_holder_of_data_alone_shares_it_and_one_that_lacks_a_part_copies_it() {
        // Extent of 4 MiB: data, zeros, data, zeros (1 MiB each). Holder 0
        // holds only the first 2 MiB; holder 1 (a copy the share phase
        // shared) only the data at 2 MiB, without zeros of its own.
        let w = plan(
            &[held(0, 0, 0, 2 * M), held(1, 8 * M, 2 * M, M), held(2, 0, 0, 4 * M)],
            &[vec![(M, M)], vec![], vec![(M, M), (3 * M, M)]],
            4 * K,
            64 * K,
            4.0,
        )
        .unwrap();
        assert_eq!((w.zero_bytes(), w.data), (2 * M, 2 * M));
        assert_eq!(
            w.steps,
            vec![
                Step::Copy { holder: 0, parts: vec![(0, M)] },
                Step::Punch { holder: 0, parts: vec![(M, M)] },
                Step::Copy { holder: 1, parts: vec![(8 * M, M)] },
                Step::Share { from: 0, from_at: 0, to: 2, to_at: 0, len: M },
                Step::Share { from: 1, from_at: 8 * M, to: 2, to_at: 2 * M, len: M },
                Step::Punch { holder: 2, parts: vec![(M, M), (3 * M, M)] },
            ]
        );
    }

    #[test]
    fn a_clone_written_in_place_punches_its_short_pieces_of_a_long_run() {
        // Holder 1 wrote 4 KiB at 1 MiB + 32 KiB: its stretches of the
        // extent are cut there, its own runs too short to count; the
        // image's run covers them.
        let w = plan(
            &[held(0, 0, 0, 2 * M), held(1, 0, 0, M + 32 * K), held(1, M + 36 * K, M + 36 * K, M - 36 * K)],
            &[vec![(M, M)], vec![(M, 32 * K), (M + 36 * K, M - 36 * K)]],
            4 * K,
            64 * K,
            4.0,
        )
        .unwrap();
        assert_eq!((w.zero_bytes(), w.data), (M, M));
        assert_eq!(w.steps[2], Step::Share { from: 0, from_at: 0, to: 1, to_at: 0, len: M });
        assert_eq!(w.steps[3], Step::Punch { holder: 1, parts: vec![(M, 32 * K), (M + 36 * K, M - 36 * K)] });
    }

    #[test]
    fn nothing_without_data_or_with_too_much_or_with_a_partial_block() {
        let b = 4 * K;
        // Only zeros: each holder lets go alone.
        assert_eq!(
            plan(&[held(0, 0, 0, M), held(1, 0, 0, M)], &[vec![(0, M)], vec![(0, M)]], b, 64 * K, 4.0),
            Err(NoData)
        );
        // Data five times the zeros.
        assert_eq!(plan(&[held(0, 0, 0, 6 * M)], &[vec![(0, M)]], b, 64 * K, 4.0), Err(MuchData));
        // Zeros shorter than a run: data.
        assert_eq!(plan(&[held(0, 0, 0, M)], &[vec![(0, 32 * K)]], b, 64 * K, 4.0), Err(FewZeros));
        // A stretch ending in a partial block.
        assert_eq!(plan(&[held(0, 0, 0, 2 * M - 100)], &[vec![(0, M)]], b, 64 * K, 4.0), Err(Cannot));
        // A holder with no runs given.
        assert_eq!(plan(&[held(1, 0, 0, 2 * M)], &[vec![(0, M)]], b, 64 * K, 4.0), Err(Cannot));
    }

    #[test]
    fn a_short_zero_piece_between_data_is_copied_with_it() {
        // data 1 MiB, zeros 32 KiB, data, zeros 1 MiB.
        let z = vec![(M, 32 * K), (2 * M + 32 * K, M)];
        let w = plan(&[held(0, 0, 0, 3 * M + 32 * K)], &[z], 4 * K, 64 * K, 4.0).unwrap();
        assert_eq!((w.zero_bytes(), w.data), (M, 2 * M + 32 * K));
        assert_eq!(w.steps[0], Step::Copy { holder: 0, parts: vec![(0, 2 * M + 32 * K)] });
    }

    #[test]
    fn the_shortest_run_grows_with_the_stretches_its_holes_cut() {
        // 300 clones of an extent of 64 KiB data, 128 KiB zeros, 64 KiB
        // data: a hole would cost each clone an item, so the zeros are
        // left; 32 clones keep the plain minimum.
        let runs = |n: usize, len: u64| -> (Vec<Held>, Vec<Vec<(u64, u64)>>) {
            ((0..n).map(|i| held(i, 0, 0, len)).collect(), vec![vec![(64 * K, 128 * K)]; n])
        };
        let (h, z) = runs(300, 256 * K);
        assert_eq!(plan(&h, &z, 4 * K, 64 * K, 4.0), Err(FewZeros));
        let (h, z) = runs(32, 256 * K);
        assert_eq!(plan(&h, &z, 4 * K, 64 * K, 4.0).map(|w| w.zero_bytes()), Ok(128 * K));
        // The run at the end of every stretch: no item is split.
        let (h, z) = runs(300, 192 * K);
        assert_eq!(plan(&h, &z, 4 * K, 64 * K, 4.0).map(|w| w.zero_bytes()), Ok(128 * K));
        // 300 clones of runs of 1 MiB: worth it.
        let h: Vec<Held> = (0..300).map(|i| held(i, 0, 0, 3 * M)).collect();
        let w = plan(&h, &vec![vec![(M, M)]; 300], 4 * K, 64 * K, 4.0).unwrap();
        assert_eq!((w.zero_bytes(), w.data), (M, 2 * M));
    }

    #[test]
    fn an_extent_whose_holders_would_be_compared_far_more_than_it_frees_is_left() {
        // 1 MiB of data and 1 MiB of zeros: 512 holders compare 1,024
        // times the zeros; one more is too many.
        let h = |n: usize| -> Vec<Held> { (0..n).map(|i| held(i, 0, 0, 2 * M)).collect() };
        let z = |n: usize| vec![vec![(M, M)]; n];
        assert_eq!(plan(&h(512), &z(512), 4 * K, 64 * K, 4.0).map(|w| w.zero_bytes()), Ok(M));
        assert_eq!(plan(&h(513), &z(513), 4 * K, 64 * K, 4.0), Err(ManyHolders));
    }

    #[test]
    fn a_run_cuts_only_the_stretches_it_lies_strictly_inside() {
        let spans: BTreeMap<u64, u64> = [(M, 2 * M), (3 * M, 4 * M)].into();
        let h = [held(0, 0, 0, 5 * M), held(1, 0, 0, 2 * M), held(2, 0, M, 3 * M), held(3, 0, M / 2, 3 * M)];
        // 0 holds both inside, 1 ends at the first, 2 begins at it, 3 holds
        // the first inside and ends in the second.
        assert_eq!(cuts(&spans, &h), vec![2, 1]);
    }
}
