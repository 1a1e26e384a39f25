//! The two messages of PostgreSQL's `pgoutput` plugin that a log relay reads: a relation's
//! description (`R`) and an inserted row (`I`), in protocol version 1 with values in binary
//! (`binary 'true'`). The replication connection, its begin and commit messages and its
//! keepalives are pgwire-replication's; the values themselves are decoded by tokio-postgres's
//! `FromSql`. What is left, the framing of these two messages, is a few lines and is written
//! here: no kept crate decodes `pgoutput` without bringing a replication client of its own.
//!
//! Every read is checked: a message that is short, or says more than it holds, is an error,
//! never a panic.

/// A message that does not decode: what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput message does not decode: {0}")]
pub(crate) struct Malformed(pub(crate) &'static str);

/// A table as a `Relation` message describes it: its columns in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Relation {
    pub(crate) id: u32,
    pub(crate) schema: String,
    pub(crate) name: String,
    /// Each column's name and type oid, in the order of a row's values.
    pub(crate) columns: Vec<(String, u32)>,
}

/// One value of an inserted row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Null,
    /// A TOASTed value left out because it did not change (never in an insert).
    Unchanged,
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

/// A message of the stream, as far as the relay cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    Relation(Relation),
    Insert {
        relation: u32,
        values: Vec<Value<'a>>,
    },
    /// A changed row: its values after the change (a TOASTed value that did not change is
    /// [`Value::Unchanged`]).
    Update {
        relation: u32,
        values: Vec<Value<'a>>,
    },
    /// Any other message (type, origin, delete, truncate): not the relay's.
    Other(u8),
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.bytes.len() < n {
            return Err(Malformed("the message ends early"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A row's values (`TupleData`).
    fn tuple(&mut self) -> Result<Vec<Value<'a>>, Malformed> {
        let n = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(n).min(self.bytes.len()));
        for _ in 0..n {
            values.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                kind @ (b't' | b'b') => {
                    let len = usize::try_from(self.u32()?)
                        .map_err(|_| Malformed("a value's length is out of range"))?;
                    let bytes = self.take(len)?;
                    if kind == b't' {
                        Value::Text(bytes)
                    } else {
                        Value::Binary(bytes)
                    }
                }
                _ => return Err(Malformed("a value of an unknown kind")),
            });
        }
        Ok(values)
    }

    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String, Malformed> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or(Malformed("a string has no end"))?;
        let s = std::str::from_utf8(&self.bytes[..end])
            .map_err(|_| Malformed("a name is not UTF-8"))?
            .to_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(s)
    }
}

/// Decodes one `pgoutput` message.
pub(crate) fn decode(bytes: &[u8]) -> Result<Message<'_>, Malformed> {
    let mut r = Reader { bytes };
    match r.u8()? {
        b'R' => {
            let id = r.u32()?;
            let schema = r.string()?;
            let name = r.string()?;
            let _replica_identity = r.u8()?;
            let n = r.u16()?;
            let mut columns = Vec::with_capacity(usize::from(n).min(r.bytes.len()));
            for _ in 0..n {
                let _flags = r.u8()?;
                let column = r.string()?;
                let oid = r.u32()?;
                let _modifier = r.u32()?;
                columns.push((column, oid));
            }
            Ok(Message::Relation(Relation {
                id,
                schema,
                name,
                columns,
            }))
        }
        b'I' => {
            let relation = r.u32()?;
            if r.u8()? != b'N' {
                return Err(Malformed("an insert without its new row"));
            }
            let values = r.tuple()?;
            Ok(Message::Insert { relation, values })
        }
        b'U' => {
            let relation = r.u32()?;
            let mut tag = r.u8()?;
            if matches!(tag, b'K' | b'O') {
                // The old row's key or values: not what the relay publishes.
                r.tuple()?;
                tag = r.u8()?;
            }
            if tag != b'N' {
                return Err(Malformed("an update without its new row"));
            }
            let values = r.tuple()?;
            Ok(Message::Update { relation, values })
        }
        other => Ok(Message::Other(other)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A `Relation` message, as the server writes it.
    pub(crate) fn relation(id: u32, schema: &str, name: &str, columns: &[(&str, u32)]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        for s in [schema, name] {
            m.extend(s.as_bytes());
            m.push(0);
        }
        m.push(b'd');
        m.extend((columns.len() as u16).to_be_bytes());
        for (c, oid) in columns {
            m.push(0);
            m.extend(c.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    /// A row's values as the server writes them: `None` a null, `Some(None)` a TOASTed value
    /// left out, `Some(Some(bytes))` a binary value.
    fn tuple(values: &[Option<Option<&[u8]>>]) -> Vec<u8> {
        let mut m = (values.len() as u16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => m.push(b'n'),
                Some(None) => m.push(b'u'),
                Some(Some(v)) => {
                    m.push(b'b');
                    m.extend((v.len() as u32).to_be_bytes());
                    m.extend(*v);
                }
            }
        }
        m
    }

    /// An `Insert` message of binary values (`None`: a null).
    pub(crate) fn insert(relation: u32, values: &[Option<&[u8]>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(relation.to_be_bytes());
        m.push(b'N');
        let values: Vec<_> = values.iter().map(|v| v.map(Some)).collect();
        m.extend(tuple(&values));
        m
    }

    #[test]
    fn a_relation_and_a_row_decode() {
        let r = relation(7, "public", "surely_outbox", &[("seq", 20), ("id", 25)]);
        let Message::Relation(rel) = decode(&r).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!(rel.id, 7);
        assert_eq!(
            (rel.schema.as_str(), rel.name.as_str()),
            ("public", "surely_outbox")
        );
        assert_eq!(
            rel.columns,
            vec![("seq".to_owned(), 20), ("id".to_owned(), 25)]
        );
        let i = insert(7, &[Some(&1i64.to_be_bytes()), None]);
        assert_eq!(
            decode(&i).unwrap(),
            Message::Insert {
                relation: 7,
                values: vec![Value::Binary(&1i64.to_be_bytes()), Value::Null]
            }
        );
        assert_eq!(decode(b"Yabc").unwrap(), Message::Other(b'Y'));
    }

    #[test]
    fn an_update_gives_its_new_row() {
        let mut u = vec![b'U'];
        u.extend(7u32.to_be_bytes());
        u.push(b'K');
        u.extend(tuple(&[Some(Some(b"key"))]));
        u.push(b'N');
        u.extend(tuple(&[Some(Some(b"ab")), None, Some(None)]));
        assert_eq!(
            decode(&u).unwrap(),
            Message::Update {
                relation: 7,
                values: vec![Value::Binary(b"ab"), Value::Null, Value::Unchanged]
            }
        );
        u[5] = b'X';
        assert!(decode(&u).is_err());
    }

    #[test]
    fn a_short_or_lying_message_is_an_error() {
        let i = insert(7, &[Some(b"abcd")]);
        for cut in 0..i.len() {
            assert!(decode(&i[..cut]).is_err(), "cut at {cut}");
        }
        let mut lying = insert(7, &[Some(b"abcd")]);
        lying[9] = 0xff; // the value's length, far past the end
        assert!(decode(&lying).is_err());
        let r = relation(7, "public", "t", &[("id", 25)]);
        for cut in 1..r.len() {
            assert!(decode(&r[..cut]).is_err(), "cut at {cut}");
        }
    }

    proptest! {
        /// Whatever the bytes, decoding answers without a panic.
        #[test]
        fn any_bytes_decode_or_fail_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        /// A message starting like an insert or a relation, then anything.
        #[test]
        fn any_insert_or_relation_tail_decodes_or_fails(
            kind in prop_oneof![Just(b'I'), Just(b'R'), Just(b'U')],
            tail in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut m = vec![kind];
            m.extend(tail);
            let _ = decode(&m);
        }
    }
}
