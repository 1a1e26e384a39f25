//! The checks an example's story makes, and its verdict: one line per invariant, then
//! `invariants: ok`, or what failed.

/// The failed checks, and the invariants' lines.
#[derive(Default)]
pub(crate) struct Checks {
    failed: Vec<String>,
}

impl Checks {
    /// A check: counted if it fails.
    pub(crate) fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.failed.push(what.into());
        }
    }

    /// An invariant: printed, and counted if it fails.
    pub(crate) fn invariant(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        println!("  {} {what}", if ok { "holds " } else { "FAILED" });
        self.check(ok, what);
    }

    /// Prints `invariants: ok`, or each failed check and `invariants: FAILED`; whether all held.
    pub(crate) fn verdict(&self) -> bool {
        if self.failed.is_empty() {
            println!("invariants: ok");
            return true;
        }
        for f in &self.failed {
            println!("failed: {f}");
        }
        println!("invariants: FAILED ({} check(s))", self.failed.len());
        false
    }
}
