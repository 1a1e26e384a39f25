//! The review as text: what `surely review` prints.

use std::fmt;

use super::check::figure_text;
use super::{Review, Severity};

impl fmt::Display for Review {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for op in self.operations() {
            writeln!(
                f,
                "{}.{} ({}, {})",
                op.service, op.operation, op.kind, op.method
            )?;
            for a in &op.answers {
                writeln!(f, "  {}. {}", a.question.number(), a.question.text())?;
                for line in &a.given {
                    writeln!(f, "     - {line}")?;
                }
                if let Some(open) = &a.open {
                    writeln!(f, "     ? the settings do not say: {open}")?;
                }
            }
            writeln!(f)?;
        }
        if !self.paths().is_empty() {
            writeln!(
                f,
                "paths (calls at the end per call at the start when the end fails; limit {}):",
                figure_text(self.max_amplification())
            )?;
            for p in self.paths() {
                writeln!(
                    f,
                    "  {}: {} worst, {} with the retry budgets, {} retrying hop(s)",
                    p.path.join(" -> "),
                    figure_text(p.worst),
                    figure_text(p.bounded),
                    p.retry_owners
                )?;
            }
            writeln!(f)?;
        }
        let count = |s: Severity| self.findings().iter().filter(|x| x.severity == s).count();
        writeln!(
            f,
            "findings: {} error(s), {} warning(s), {} info",
            count(Severity::Error),
            count(Severity::Warning),
            count(Severity::Info)
        )?;
        for x in self.findings() {
            writeln!(
                f,
                "  {:<7} {}  {}",
                x.severity.as_str(),
                x.id,
                x.path.join(" -> ")
            )?;
            writeln!(f, "          {}", x.message)?;
            writeln!(f, "          fix: {}", x.fix)?;
        }
        Ok(())
    }
}
