//! Helpers shared by every test binary (`#[path = "../support/mod.rs"] mod support;`): a
//! binary that uses only some of them allows the rest to go unused.

pub(crate) mod serve;
