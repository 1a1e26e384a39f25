//! The method semantics layer and its builder.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::MethodSemantics;
use crate::{ConfigError, Semantics};

/// Marks gRPC requests with the [`Semantics`] of their method, by path; see the
/// [module docs](super).
///
/// A request that already carries a [`Semantics`] extension keeps it. A method listed by its
/// full path wins over its service's entry. Requests of methods not listed pass unchanged (and
/// are then [`NonIdempotent`](Semantics::NonIdempotent), as POSTs).
///
/// Place it outside the client stack (outside the retry layer, which reads the mark).
#[derive(Clone, Debug)]
pub struct MethodSemanticsLayer {
    table: Arc<Table>,
}

#[derive(Debug, Default)]
pub(super) struct Table {
    /// Full method paths, `/package.Service/Method`.
    methods: HashMap<String, Semantics>,
    /// Fully qualified service names, `package.Service`.
    services: HashMap<String, Semantics>,
}

impl Table {
    pub(super) fn lookup(&self, path: &str) -> Option<Semantics> {
        if let Some(s) = self.methods.get(path) {
            return Some(*s);
        }
        if self.services.is_empty() {
            return None;
        }
        let service = path.strip_prefix('/')?.split_once('/')?.0;
        self.services.get(service).copied()
    }
}

impl MethodSemanticsLayer {
    /// A layer with no entries, which marks nothing: every request passes unchanged. Give it
    /// entries with [`builder`](Self::builder).
    pub fn new() -> Self {
        MethodSemanticsLayer {
            table: Arc::new(Table::default()),
        }
    }

    /// A builder with no entries.
    pub fn builder() -> MethodSemanticsLayerBuilder {
        MethodSemanticsLayerBuilder {
            table: Table::default(),
            error: None,
        }
    }

    /// The semantics this layer gives a request for `path` (`/package.Service/Method`), if any.
    ///
    /// ```
    /// use surely::grpc::MethodSemanticsLayer;
    /// use surely::Semantics;
    ///
    /// let marks = MethodSemanticsLayer::builder()
    ///     .service("shop.Catalog", Semantics::Safe)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(marks.semantics_of("/shop.Catalog/List"), Some(Semantics::Safe));
    /// assert_eq!(marks.semantics_of("/shop.Orders/Create"), None);
    /// ```
    pub fn semantics_of(&self, path: &str) -> Option<Semantics> {
        self.table.lookup(path)
    }
}

/// Builds a [`MethodSemanticsLayer`]; [`build`](Self::build) checks the names.
#[must_use = "a builder does nothing until `build` is called"]
pub struct MethodSemanticsLayerBuilder {
    table: Table,
    error: Option<ConfigError>,
}

impl MethodSemanticsLayerBuilder {
    /// Gives the method at `path` (`/package.Service/Method`, as on the wire) these semantics.
    pub fn method(mut self, path: impl Into<String>, semantics: Semantics) -> Self {
        let path = path.into();
        let valid = path
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(service, method)| valid_name(service) && valid_name(method));
        if !valid {
            self.error.get_or_insert(ConfigError::new(
                "gRPC method path",
                "must be `/package.Service/Method`, with a non-empty service and method",
            ));
        }
        self.table.methods.insert(path, semantics);
        self
    }

    /// Gives every method of the service `name` (`package.Service`, without slashes) these
    /// semantics.
    pub fn service(mut self, name: impl Into<String>, semantics: Semantics) -> Self {
        let name = name.into();
        if !valid_name(&name) {
            self.error.get_or_insert(ConfigError::new(
                "gRPC service name",
                "must be a non-empty `package.Service`, without slashes",
            ));
        }
        self.table.services.insert(name, semantics);
        self
    }

    /// The layer, or the first malformed name.
    ///
    /// ```
    /// use surely::grpc::MethodSemanticsLayer;
    /// use surely::Semantics;
    ///
    /// let err = MethodSemanticsLayer::builder()
    ///     .method("GetOrder", Semantics::Safe)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "gRPC method path");
    /// ```
    pub fn build(self) -> Result<MethodSemanticsLayer, ConfigError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(MethodSemanticsLayer {
                table: Arc::new(self.table),
            }),
        }
    }
}

impl fmt::Debug for MethodSemanticsLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodSemanticsLayerBuilder")
            .field("methods", &self.table.methods.len())
            .field("services", &self.table.services.len())
            .finish_non_exhaustive()
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name.bytes().all(|b| b.is_ascii_graphic())
}

impl Default for MethodSemanticsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for MethodSemanticsLayer {
    type Service = MethodSemantics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MethodSemantics {
            inner,
            table: self.table.clone(),
        }
    }
}
