//! What the configuration structs share: durations read by humantime, and a builder's
//! rejection said of the field it came from.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::ConfigError;

/// An optional duration written as humantime reads it: `300ms`, `2s`, `1m 30s`.
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<Human>::deserialize(d).map(|h| h.map(|h| h.0))
}

/// A duration, deserialized from a humantime string.
struct Human(Duration);

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(HumanVisitor)
    }
}

struct HumanVisitor;

impl Visitor<'_> for HumanVisitor {
    type Value = Human;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration written as a string, such as \"300ms\", \"2s\" or \"1m 30s\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Human, E> {
        humantime::parse_duration(s).map(Human).map_err(|e| {
            E::custom(format_args!(
                "invalid duration {s:?}: {e} (write it as \"300ms\", \"2s\" or \"1m 30s\")"
            ))
        })
    }
}

/// Says a builder's rejection of the field it came from: `fields` pairs the builder's name for
/// a setting ([`ConfigError::setting`]) with the field's path. A setting not listed keeps the
/// builder's name, which still says what was wrong.
pub(crate) fn of_field(
    fields: &'static [(&'static str, &'static str)],
) -> impl Fn(ConfigError) -> ConfigError {
    move |e| match fields.iter().find(|(setting, _)| *setting == e.setting()) {
        Some((_, field)) => e.of_setting(field),
        None => e,
    }
}
