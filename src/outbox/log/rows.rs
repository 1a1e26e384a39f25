//! An outbox row as the log carries it, read back as an event.

use std::collections::HashMap;

use bytes::Bytes;
use tokio_postgres::types::{FromSql, Type};

use super::pgoutput::{Relation, Value};
use crate::outbox::{Event, EventId};

/// The columns an event is read from, in this order.
const COLUMNS: [(&str, Type); 10] = [
    ("id", Type::TEXT),
    ("aggregate", Type::TEXT),
    ("version", Type::INT8),
    ("kind", Type::TEXT),
    ("header_names", Type::TEXT_ARRAY),
    ("header_values", Type::TEXT_ARRAY),
    ("payload", Type::BYTEA),
    ("state", Type::INT2),
    ("claim", Type::INT8),
    ("seq", Type::INT8),
];

const ID: usize = 0;
const STATE: usize = 7;
const CLAIM: usize = 8;
const SEQ: usize = 9;

/// The outbox's pending state, as its table keeps it.
const PENDING: i16 = 0;

/// Where each of [`COLUMNS`] is in a table's rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout([usize; COLUMNS.len()]);

/// The tables the log described so far: the server describes a table before its first row
/// on each connection, and again after its definition changed.
#[derive(Debug, Default)]
pub(super) struct Tables {
    known: HashMap<u32, Layout>,
}

impl Tables {
    /// Learns a table's layout.
    ///
    /// # Errors
    ///
    /// A column the relay reads is missing or of another type: what is wrong.
    pub(super) fn learn(&mut self, relation: &Relation) -> Result<(), String> {
        let mut at = [0; COLUMNS.len()];
        for (i, (name, ty)) in COLUMNS.iter().enumerate() {
            let found = relation.columns.iter().position(|(c, _)| c == name);
            let Some(p) = found else {
                return Err(format!(
                    "the table {}.{} has no column `{name}`",
                    relation.schema, relation.name
                ));
            };
            let oid = relation.columns[p].1;
            if oid != ty.oid() {
                return Err(format!(
                    "the column `{name}` of {}.{} is of type {}, not {ty}",
                    relation.schema,
                    relation.name,
                    Type::from_oid(oid).map_or_else(|| format!("oid {oid}"), |t| t.to_string())
                ));
            }
            at[i] = p;
        }
        self.known.insert(relation.id, Layout(at));
        Ok(())
    }

    pub(super) fn get(&self, id: u32) -> Option<Layout> {
        self.known.get(&id).copied()
    }
}

/// What a row of the log is to the relay.
#[derive(Debug)]
pub(super) enum Decoded {
    /// An event to publish, with the row's claim number and its place in the order enqueued.
    Event { event: Event, claim: i64, seq: i64 },
    /// A pending row whose values the log left out: read it from the table.
    Unchanged { id: EventId },
    /// A row that is not an event to publish: one no longer pending (a mark, a quarantine).
    Skip,
    /// A row that does not read as an event: its id as the table has it, and why.
    Bad { id: String, reason: String },
}

/// The row of `values` in a table of `layout`; `update`: a changed row, published only if it
/// is pending again (requeued).
///
/// # Errors
///
/// The id cannot be read: no row can be named to quarantine.
pub(super) fn decode(
    layout: Layout,
    values: &[Value<'_>],
    message: &Bytes,
    max_payload: usize,
) -> Result<Decoded, String> {
    let value = |i: usize| values.get(layout.0[i]).unwrap_or(&Value::Null);
    let id = match value(ID) {
        Value::Binary(raw) => {
            String::from_sql(&Type::TEXT, raw).map_err(|e| format!("the id does not read: {e}"))?
        }
        Value::Unchanged => return Err("the id is left out".to_owned()),
        Value::Null => return Err("the id is null".to_owned()),
        Value::Text(_) => return Err("the id is in text format, not binary".to_owned()),
    };
    let bad = |reason: String| Decoded::Bad {
        id: id.clone(),
        reason,
    };
    let state: i16 = match read(value(STATE), &Type::INT2, "state") {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(Decoded::Skip),
        Err(e) => return Ok(bad(e)),
    };
    if state != PENDING {
        return Ok(Decoded::Skip);
    }
    if (0..COLUMNS.len()).any(|i| matches!(value(i), Value::Unchanged)) {
        return Ok(match EventId::new(id.clone()) {
            Ok(id) => Decoded::Unchanged { id },
            Err(e) => bad(e.to_string()),
        });
    }
    Ok(match event(&value, message, max_payload) {
        Ok((event, claim, seq)) => Decoded::Event { event, claim, seq },
        Err(reason) => bad(reason),
    })
}

/// The event of a row whose values are slices of `message` (the payload is kept as one, not
/// copied).
fn event<'a>(
    value: &impl Fn(usize) -> &'a Value<'a>,
    message: &Bytes,
    max_payload: usize,
) -> Result<(Event, i64, i64), String> {
    let required = |i: usize, ty: &Type| -> Result<&'a [u8], String> {
        let name = COLUMNS[i].0;
        match value(i) {
            Value::Binary(raw) => Ok(raw),
            Value::Null => Err(format!("the column `{name}` is null")),
            _ => Err(format!(
                "the column `{name}` is not in binary format ({ty})"
            )),
        }
    };
    let text = |i: usize| -> Result<String, String> {
        String::from_sql(&Type::TEXT, required(i, &Type::TEXT)?)
            .map_err(|e| format!("the column `{}` does not read: {e}", COLUMNS[i].0))
    };
    let texts = |i: usize| -> Result<Vec<String>, String> {
        Vec::<String>::from_sql(&Type::TEXT_ARRAY, required(i, &Type::TEXT_ARRAY)?)
            .map_err(|e| format!("the column `{}` does not read: {e}", COLUMNS[i].0))
    };
    let number = |i: usize| -> Result<i64, String> {
        i64::from_sql(&Type::INT8, required(i, &Type::INT8)?)
            .map_err(|e| format!("the column `{}` does not read: {e}", COLUMNS[i].0))
    };
    let id = EventId::new(text(ID)?).map_err(|e| e.to_string())?;
    let payload = required(6, &Type::BYTEA)?;
    if payload.len() > max_payload {
        return Err(format!(
            "the payload of {} bytes is over the relay's max_payload of {max_payload}",
            payload.len()
        ));
    }
    let (names, values) = (texts(4)?, texts(5)?);
    if names.len() != values.len() {
        return Err(format!(
            "{} header names and {} header values",
            names.len(),
            values.len()
        ));
    }
    let mut event = Event::new(
        id,
        text(1)?,
        number(2)?,
        text(3)?,
        part_of(message, payload),
    )
    .map_err(|e| e.to_string())?;
    for (name, v) in names.into_iter().zip(values) {
        event = event.with_header(name, v).map_err(|e| e.to_string())?;
    }
    Ok((event, number(CLAIM)?, number(SEQ)?))
}

/// `part` as a slice of `message` when it lies within it (as a value decoded from it does),
/// else a copy: never the panic of `Bytes::slice_ref` on a slice from elsewhere.
fn part_of(message: &Bytes, part: &[u8]) -> Bytes {
    let whole = message.as_ptr_range();
    let range = part.as_ptr_range();
    if whole.start <= range.start && range.end <= whole.end {
        message.slice_ref(part)
    } else {
        Bytes::copy_from_slice(part)
    }
}

/// A value that may be null.
fn read<'a, T: FromSql<'a>>(value: &Value<'a>, ty: &Type, name: &str) -> Result<Option<T>, String> {
    match value {
        Value::Binary(raw) => T::from_sql(ty, raw)
            .map(Some)
            .map_err(|e| format!("the column `{name}` does not read: {e}")),
        Value::Null | Value::Unchanged => Ok(None),
        Value::Text(_) => Err(format!("the column `{name}` is in text format, not binary")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::{decode as decode_message, tests as wire, Message};
    use super::*;
    use tokio_postgres::types::ToSql;

    fn relation() -> Relation {
        let columns: Vec<(&str, u32)> = COLUMNS.iter().map(|(n, t)| (*n, t.oid())).collect();
        let m = wire::relation(9, "public", "surely_outbox", &columns);
        let Message::Relation(r) = decode_message(&m).unwrap() else {
            panic!()
        };
        r
    }

    fn bin<T: ToSql>(v: T, ty: &Type) -> Vec<u8> {
        let mut out = bytes::BytesMut::new();
        v.to_sql(ty, &mut out).unwrap();
        out.to_vec()
    }

    struct Row {
        id: String,
        kind: String,
        names: Vec<String>,
        values: Vec<String>,
        payload: Vec<u8>,
        state: i16,
    }

    impl Row {
        fn new() -> Self {
            Row {
                id: "e-1".into(),
                kind: "OrderCreated".into(),
                names: vec!["trace".into()],
                values: vec!["t-1".into()],
                payload: b"{}".to_vec(),
                state: 0,
            }
        }

        fn decode(&self, max_payload: usize) -> Result<Decoded, String> {
            let cols = [
                bin(&self.id, &Type::TEXT),
                bin("order o-1", &Type::TEXT),
                bin(3i64, &Type::INT8),
                bin(&self.kind, &Type::TEXT),
                bin(&self.names, &Type::TEXT_ARRAY),
                bin(&self.values, &Type::TEXT_ARRAY),
                bin(&self.payload, &Type::BYTEA),
                bin(self.state, &Type::INT2),
                bin(4i64, &Type::INT8),
                bin(1i64, &Type::INT8),
            ];
            let vals: Vec<Option<&[u8]>> = cols.iter().map(|c| Some(c.as_slice())).collect();
            let m = Bytes::from(wire::insert(9, &vals));
            let Message::Insert { values, .. } = decode_message(&m).unwrap() else {
                panic!()
            };
            let mut tables = Tables::default();
            tables.learn(&relation()).unwrap();
            decode(tables.get(9).unwrap(), &values, &m, max_payload)
        }
    }

    #[test]
    fn a_row_reads_as_its_event() {
        let Decoded::Event { event, claim, seq } = Row::new().decode(1024).unwrap() else {
            panic!()
        };
        assert_eq!(seq, 1);
        assert_eq!(event.id().as_str(), "e-1");
        assert_eq!(event.aggregate(), "order o-1");
        assert_eq!(event.version(), 3);
        assert_eq!(event.kind(), "OrderCreated");
        assert_eq!(event.headers(), &[("trace".to_owned(), "t-1".to_owned())]);
        assert_eq!(&event.payload()[..], b"{}");
        assert_eq!(claim, 4);
    }

    #[test]
    fn a_row_that_is_not_an_event_is_bad_with_its_reason() {
        let mut r = Row::new();
        r.kind = "not a kind!".into();
        assert!(
            matches!(r.decode(1024), Ok(Decoded::Bad { id, reason }) if id == "e-1" && reason.contains("kind")),
        );
        let mut r = Row::new();
        r.payload = vec![0; 2000];
        assert!(
            matches!(r.decode(1024), Ok(Decoded::Bad { reason, .. }) if reason.contains("max_payload")),
        );
        let mut r = Row::new();
        r.values.clear();
        assert!(
            matches!(r.decode(1024), Ok(Decoded::Bad { reason, .. }) if reason.contains("header"))
        );
        let mut r = Row::new();
        r.state = 1;
        assert!(matches!(r.decode(1024), Ok(Decoded::Skip)));
    }

    #[test]
    fn a_table_without_a_column_is_refused() {
        let mut r = relation();
        r.columns.retain(|(c, _)| c != "payload");
        let err = Tables::default().learn(&r).unwrap_err();
        assert!(err.contains("`payload`"), "{err}");
        let mut r = relation();
        r.columns[1].1 = Type::INT4.oid();
        let err = Tables::default().learn(&r).unwrap_err();
        assert!(err.contains("of type int4, not text"), "{err}");
    }
}
