//! The chain file (feature `review`): a [`Chain`] read from TOML, its clients and server layers
//! configured by the structs of [`surely::config`](crate::config) and
//! [`surely::server::config`](crate::server::config) and described by the builders they
//! configure, so that the review sees the settings a service built from the same sections
//! would run with. The format is in [`docs::review`](crate::docs::review#the-chain-file).

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::config::{duration, ClientConfig};
use crate::review::{
    Boundary, Chain, InboxSettings, Kind, LedgerSettings, Operation, OutboxSettings, RelayKind,
    ReviewError, ReviewErrorKind, ServerSettings, Service, VersionPolicy,
};
use crate::server::config::{DeadlineConfig, IdempotencyConfig};
use crate::server::deadline::ServerDeadlineLayer;
use crate::server::idempotency::IdempotencyLayer;
use crate::server::store::MemoryStore;
use crate::ConfigError;

/// The largest chain file read: 4 MiB.
const MAX_FILE: usize = 4 << 20;
/// The deepest nesting of brackets and braces read.
const MAX_DEPTH: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    review: ReviewSection,
    #[serde(default)]
    services: BTreeMap<String, Spanned<ServiceFile>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewSection {
    max_amplification: Option<Spanned<f64>>,
    rate: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFile {
    #[serde(default)]
    external: bool,
    accepts_key: Option<bool>,
    server: Option<Spanned<ServerFile>>,
    #[serde(default)]
    clients: BTreeMap<String, Spanned<ClientFile>>,
    #[serde(default)]
    operations: BTreeMap<String, Spanned<OperationFile>>,
    inbox: Option<InboxFile>,
    outbox: Option<OutboxFile>,
    ledger: Option<LedgerFile>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Preset {
    #[default]
    Client,
    Http,
    Grpc,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFile {
    #[serde(default)]
    preset: Preset,
    keys: Option<bool>,
    #[serde(default = "yes")]
    breaker: bool,
    #[serde(default)]
    journal: bool,
    #[serde(default)]
    resolver: bool,
    #[serde(default)]
    settings: ClientConfig,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    deadline: Option<DeadlineConfig>,
    #[serde(default)]
    trust_retry_signals: bool,
    idempotency: Option<IdempotencyFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdempotencyFile {
    #[serde(default = "memory")]
    store: String,
    #[serde(default)]
    boundary: Boundary,
    #[serde(default)]
    settings: IdempotencyConfig,
}

fn memory() -> String {
    "memory".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationFile {
    kind: Kind,
    method: Option<String>,
    #[serde(default)]
    money: bool,
    key: Option<String>,
    #[serde(default)]
    calls: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InboxFile {
    #[serde(default)]
    versions: VersionPolicy,
    change_events: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutboxFile {
    #[serde(default)]
    relay: RelayKind,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerFile {
    #[serde(default)]
    resolver: bool,
    #[serde(default, deserialize_with = "duration")]
    alert_after: Option<Duration>,
    #[serde(default)]
    manual_queue: bool,
}

/// Where each call of the file is, by (service, operation, index).
type Sites = BTreeMap<(String, String, usize), Range<usize>>;

impl Chain {
    /// Reads a chain from its TOML file (feature `review`): the format is in
    /// [`docs::review`](crate::docs::review#the-chain-file).
    ///
    /// ```
    /// use surely::review::Chain;
    ///
    /// let chain = Chain::from_toml(r#"
    /// [services.web.clients.orders]
    /// preset = "http"
    /// settings = { timeout = "2s" }
    ///
    /// [services.web.operations.buy]
    /// kind = "write"
    /// calls = ["orders.place"]
    ///
    /// [services.orders.operations.place]
    /// kind = "write"
    /// "#).unwrap();
    /// let review = chain.review().unwrap();
    /// assert!(review.findings().iter().any(|f| f.id.as_str() == "unknown-unowned"));
    ///
    /// let err = Chain::from_toml("[services.web]\nexternal = \"yes\"\n").unwrap_err();
    /// assert_eq!((err.line(), err.column()), (Some(2), Some(12)));
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ReviewError`] with the line and column of the fault: a file that is not TOML, a
    /// setting the format does not know, a value of the wrong type or one a builder refuses, a
    /// call to a service or an operation the file does not have, or through a client the
    /// caller does not have, a cycle; a file over 4 MiB or nested deeper than 64.
    pub fn from_toml(text: &str) -> Result<Chain, ReviewError> {
        Self::from_toml_unchecked(text).and_then(|(chain, sites)| {
            // The names and the graph are checked where the review checks them, and placed.
            match chain.review() {
                Ok(_) => Ok(chain),
                Err(e) => Err(place(e, &sites, text)),
            }
        })
    }

    fn from_toml_unchecked(text: &str) -> Result<(Chain, Sites), ReviewError> {
        if text.len() > MAX_FILE {
            return Err(ReviewError::new(
                ReviewErrorKind::Parse,
                format!(
                    "the file is {} bytes, over the limit of {MAX_FILE}",
                    text.len()
                ),
            ));
        }
        if let Some(at) = too_deep(text) {
            let (l, c) = line_column(text, at);
            return Err(ReviewError::new(
                ReviewErrorKind::Parse,
                format!("nested deeper than {MAX_DEPTH}"),
            )
            .at(l, c));
        }
        let file: File = toml::from_str(text).map_err(|e| {
            let err = ReviewError::new(ReviewErrorKind::Parse, e.message().trim().to_owned());
            match e.span() {
                Some(span) => {
                    let (l, c) = line_column(text, span.start);
                    err.at(l, c)
                }
                None => err,
            }
        })?;
        let mut chain = Chain::new();
        if let Some(limit) = &file.review.max_amplification {
            if !(limit.get_ref().is_finite() && *limit.get_ref() >= 1.0) {
                let (l, c) = line_column(text, limit.span().start);
                return Err(ReviewError::new(
                    ReviewErrorKind::Invalid,
                    "max_amplification must be a finite number of at least 1",
                )
                .at(l, c));
            }
            chain = chain.max_amplification(*limit.get_ref());
        }
        if let Some(rate) = &file.review.rate {
            if !(rate.get_ref().is_finite() && *rate.get_ref() > 0.0) {
                let (l, c) = line_column(text, rate.span().start);
                return Err(ReviewError::new(
                    ReviewErrorKind::Invalid,
                    "rate must be a finite number above 0",
                )
                .at(l, c));
            }
            chain = chain.rate(*rate.get_ref());
        }
        let mut sites = Sites::new();
        for (name, service) in file.services {
            let span = service.span();
            let service = service.into_inner();
            let mut s = if service.external {
                let mut s = Service::new(name.clone());
                s.external = true;
                s.accepts_key = service.accepts_key;
                s
            } else {
                Service::new(name.clone())
            };
            if let Some(server) = service.server {
                let at = server.span().start;
                s = s.server(server_settings(server.into_inner()).map_err(|e| {
                    let (l, c) = line_column(text, at);
                    parse_error(&e, "server").at(l, c)
                })?);
            }
            for (callee, client) in service.clients {
                let at = client.span().start;
                let settings = client_settings(client.into_inner()).map_err(|e| {
                    let (l, c) = line_column(text, at);
                    parse_error(&e, "settings").at(l, c)
                })?;
                s = s.client(callee, settings);
            }
            for (op_name, op) in service.operations {
                let op = op.into_inner();
                let mut o = match op.kind {
                    Kind::Read => Operation::read(op_name.clone()),
                    Kind::Idempotent => Operation::idempotent(op_name.clone()),
                    Kind::Write => Operation::write(op_name.clone()),
                };
                if let Some(method) = op.method {
                    o = o.method(method);
                }
                if op.money {
                    o = o.money();
                }
                if let Some(key) = op.key {
                    o = o.key(key);
                }
                for (i, call) in op.calls.into_iter().enumerate() {
                    let at = call.span();
                    let call = call.into_inner();
                    let Some((svc, callee_op)) = call.split_once('.') else {
                        let (l, c) = line_column(text, at.start);
                        return Err(ReviewError::new(
                            ReviewErrorKind::Parse,
                            format!("a call is written `service.operation`, not `{call}`"),
                        )
                        .at(l, c));
                    };
                    sites.insert((name.clone(), op_name.clone(), i), at);
                    o = o.calls(svc, callee_op);
                }
                s = s.operation(o);
            }
            if let Some(inbox) = service.inbox {
                s = s.inbox(InboxSettings {
                    name: name.clone(),
                    versions: inbox.versions,
                    change_events: inbox.change_events,
                });
            }
            if let Some(outbox) = service.outbox {
                s = s.outbox(OutboxSettings {
                    relay: outbox.relay,
                });
            }
            if let Some(ledger) = service.ledger {
                s = s.ledger(LedgerSettings {
                    resolver: ledger.resolver,
                    alert_after: ledger.alert_after,
                    manual_queue: ledger.manual_queue,
                });
            }
            let _ = span;
            chain = chain.service(s);
        }
        Ok((chain, sites))
    }
}

/// A builder's refusal of a section's value, said of the section's field.
fn parse_error(e: &ConfigError, section: &str) -> ReviewError {
    ReviewError::new(ReviewErrorKind::Parse, format!("{section}: {e}"))
}

fn client_settings(file: ClientFile) -> Result<crate::review::ClientSettings, ConfigError> {
    let config = &file.settings;
    let mut settings = match (file.preset, config.hedge.is_some()) {
        (Preset::Client, false) => config.apply(crate::client())?.describe(),
        (Preset::Client, true) => config.apply_hedged(crate::client())?.describe(),
        (Preset::Http, false) => config.apply(crate::client::http())?.describe(),
        (Preset::Http, true) => config.apply_hedged(crate::client::http())?.describe(),
        (Preset::Grpc, false) => config.apply(crate::client::grpc())?.describe(),
        (Preset::Grpc, true) => config.apply_hedged(crate::client::grpc())?.describe(),
    };
    if let Some(keys) = file.keys {
        settings.generates_keys = keys;
        if !keys {
            settings.server_honours_keys = false;
        }
    }
    if !file.breaker {
        settings.breaker = None;
    }
    settings.retry.journal = file.journal;
    settings.retry.resolver = file.resolver;
    Ok(settings)
}

fn server_settings(file: ServerFile) -> Result<ServerSettings, ConfigError> {
    let mut server = ServerSettings::default();
    if let Some(deadline) = &file.deadline {
        let mut builder = deadline.apply(ServerDeadlineLayer::builder())?;
        if file.trust_retry_signals {
            builder = builder.trust_retry_signals(|_| true);
        }
        server.deadline = Some(builder.describe());
    } else if file.trust_retry_signals {
        return Err(ConfigError::new(
            "trust_retry_signals",
            "needs a [deadline] section: the server deadline layer is what trusts them",
        ));
    }
    if let Some(idem) = &file.idempotency {
        let builder = idem
            .settings
            .apply(IdempotencyLayer::builder(MemoryStore::new()))?;
        let mut settings = builder.describe();
        settings.store = idem.store.clone();
        settings.boundary = idem.boundary;
        server.idempotency = Some(settings);
    }
    Ok(server)
}

/// The error, placed at its call in the file when it is about one.
fn place(e: ReviewError, sites: &Sites, text: &str) -> ReviewError {
    match e.site().and_then(|site| sites.get(site)) {
        Some(span) => {
            let (l, c) = line_column(text, span.start);
            e.at(l, c)
        }
        None => e,
    }
}

/// The line and the column (from 1, in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// Where the brackets and braces of `text` first nest deeper than [`MAX_DEPTH`], outside
/// strings and comments, if they do.
fn too_deep(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut chars = text.char_indices().peekable();
    while let Some((i, ch)) = chars.next() {
        match ch {
            '#' => {
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' | '\'' => {
                // A string: to its closing quote on the line (multi-line strings end at theirs).
                let quote = ch;
                let triple = text[i..].starts_with(if quote == '"' { "\"\"\"" } else { "'''" });
                if triple {
                    chars.next();
                    chars.next();
                    let close = if quote == '"' { "\"\"\"" } else { "'''" };
                    while let Some((j, c)) = chars.next() {
                        if c == '\\' && quote == '"' {
                            chars.next();
                        } else if text[j..].starts_with(close) {
                            chars.next();
                            chars.next();
                            break;
                        }
                    }
                } else {
                    while let Some((_, c)) = chars.next() {
                        if c == '\\' && quote == '"' {
                            chars.next();
                        } else if c == quote || c == '\n' {
                            break;
                        }
                    }
                }
            }
            '[' | '{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(i);
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_count_characters() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        assert_eq!(line_column(text, 10), (2, 4));
        assert_eq!(line_column(text, 999), (3, 1));
    }

    #[test]
    fn depth_is_counted_outside_strings_and_comments() {
        assert_eq!(too_deep(&"[".repeat(64)), None);
        assert_eq!(too_deep(&"[".repeat(65)), Some(64));
        assert_eq!(too_deep(&format!("a = \"{}\"", "[".repeat(100))), None);
        assert_eq!(too_deep(&format!("# {}\n", "{".repeat(100))), None);
        assert_eq!(too_deep(&format!("a = '''{}'''", "[".repeat(100))), None);
    }
}
