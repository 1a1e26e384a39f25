//! Links in the docs to items behind a feature.
//!
//! A build documents only the items of the features it has on, and a link to an item it does not
//! have is broken (`rustdoc::broken_intra_doc_links`). Such a link is written reference-style,
//! with the item's path as its label, `` [`PostgresStore`][super::PostgresStore] `` (or the
//! shortcut `` [`server::store::PostgresStore`] ``), and the doc ends with an attribute under
//! the item's own `cfg`, negated:
//!
//! ```text
//! /// A shared store ([`PostgresStore`][super::PostgresStore]) instead.
//! #[cfg_attr(
//!     not(all(feature = "server", feature = "postgres")),
//!     doc = crate::docs::links::to_features!("super::PostgresStore")
//! )]
//! ```
//!
//! With the feature on, there is no definition of the label: rustdoc resolves it as a path and
//! the link leads to the item. With it off, [`to_features!`] defines the label as the crate's list
//! of features (`crate#features`), which says what each feature adds. Rustdoc leaves no other
//! way: a reference-style link without a definition is shown with its brackets and warned about,
//! and a definition always makes a link, so its target is the one place every build has.
//!
//! `.ci/run` documents the client alone and each half alone with warnings denied: a link that
//! needs this and lacks it fails there.

/// Link reference definitions, each label to the crate's list of features
/// (`[label]: crate#features`), after a blank line so that they never continue a paragraph or a
/// table.
// Unused in a build with every feature its callers name on.
#[allow(unused_macros)]
macro_rules! to_features {
    ($($label:literal),+ $(,)?) => {
        concat!("\n\n", $("[", $label, "]: crate#features\n"),+)
    };
}

#[allow(unused_imports)]
pub(crate) use to_features;
