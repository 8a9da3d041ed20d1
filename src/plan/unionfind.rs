//! A union-find over dense `u32` numbers: the planner's classes of equal
//! blocks, and the components of files that [`super::from_db`] plans in
//! separate batches.

/// Disjoint sets of `0..n`, with path halving. The representative of a set
/// is its smallest number: deterministic, though nothing depends on it.
#[derive(Debug, Clone, Default)]
pub(super) struct UnionFind {
    /// Each number's parent; a representative is its own. Read directly
    /// once every entry has been pointed at its representative.
    pub(super) parent: Vec<u32>,
}

impl UnionFind {
    /// `n` sets of one number each.
    pub(super) fn new(n: u32) -> UnionFind {
        UnionFind { parent: (0..n).collect() }
    }

    /// One more set, of the next number alone; that number.
    pub(super) fn add(&mut self) -> u32 {
        let n = self.parent.len() as u32;
        self.parent.push(n);
        n
    }

    /// The representative of `x`'s set.
    pub(super) fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let up = self.parent[self.parent[x as usize] as usize];
            self.parent[x as usize] = up;
            x = up;
        }
        x
    }

    /// Join the sets of `a` and `b`.
    pub(super) fn union(&mut self, a: u32, b: u32) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[ra.max(rb) as usize] = ra.min(rb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unions_in_any_order_join_their_sets() {
        // 5-3, then 5-7, then 5-1: each union joins roots, so 3 stays with
        // 5 when 5's set is joined to 1 (a union of a stale root would
        // cut it off).
        let mut u = UnionFind::new(9);
        for (a, b) in [(5, 3), (5, 7), (5, 1), (8, 6)] {
            u.union(a, b);
        }
        let roots: Vec<u32> = (0..9).map(|x| u.find(x)).collect();
        assert_eq!(roots, vec![0, 1, 2, 1, 4, 1, 6, 1, 6]);
    }
}
