//! UTC timestamps with microsecond precision.
//!
//! The core never reads a clock: every `now` is an argument.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::error::FieldError;

/// A UTC instant, microseconds since the Unix epoch.
///
/// Microseconds match the precision of the v1 reference (Python
/// `datetime`); a timestamp with non-zero sub-microsecond digits is
/// rejected rather than silently rounded, since it would hash differently
/// on the two sides.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// The first instant RFC 3339 can write: `0000-01-01T00:00:00Z`.
    pub const RFC3339_MIN: Timestamp = Timestamp(-62_167_219_200_000_000);
    /// The last instant RFC 3339 can write (four-digit years):
    /// `9999-12-31T23:59:59.999999Z`. Later instants would print as
    /// `+10000-…`, which no RFC 3339 parser reads back.
    pub const RFC3339_MAX: Timestamp = Timestamp(253_402_300_799_999_999);

    /// From microseconds since the epoch.
    pub const fn from_unix_micros(us: i64) -> Self {
        Self(us)
    }

    /// From whole seconds since the epoch.
    pub const fn from_unix_seconds(s: i64) -> Self {
        Self(s.saturating_mul(1_000_000))
    }

    /// Microseconds since the epoch.
    pub const fn unix_micros(self) -> i64 {
        self.0
    }

    /// From a chrono UTC datetime (sub-microsecond digits truncated).
    pub fn from_datetime(dt: DateTime<Utc>) -> Self {
        Self(dt.timestamp_micros())
    }

    /// As a chrono UTC datetime.
    pub fn to_datetime(self) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(self.0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// Parses RFC 3339 / ISO 8601 with an explicit offset (`Z` or `±hh:mm`).
    pub fn parse_rfc3339(field: &str, s: &str) -> Result<Self, FieldError> {
        let dt = DateTime::parse_from_rfc3339(s).map_err(|e| {
            FieldError::invalid(
                field,
                format!("expected an RFC 3339 timestamp with an offset (e.g. 2026-06-09T12:00:00Z): {e}"),
            )
        })?;
        if dt.timestamp_subsec_nanos() % 1000 != 0 {
            return Err(FieldError::invalid(
                field,
                "sub-microsecond precision is not supported",
            ));
        }
        Ok(Self(dt.with_timezone(&Utc).timestamp_micros()))
    }

    /// Canonical RFC 3339 form: UTC, `Z`, always six fractional digits.
    pub fn to_rfc3339(self) -> String {
        self.to_datetime()
            .to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    /// `self + d`, saturating at the end of time.
    pub fn saturating_add(self, d: Duration) -> Self {
        let us = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(us))
    }

    /// `self - d`, saturating.
    pub fn saturating_sub(self, d: Duration) -> Self {
        let us = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        Self(self.0.saturating_sub(us))
    }

    /// How long after `earlier` this instant is; zero if it is not after.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        let diff = self.0.saturating_sub(earlier.0);
        Duration::from_micros(u64::try_from(diff).unwrap_or(0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.to_rfc3339())
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse_rfc3339("timestamp", &s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_offsets_and_rejects_naive() {
        let a = Timestamp::parse_rfc3339("created_at", "2026-06-09T12:00:00Z").unwrap();
        let b = Timestamp::parse_rfc3339("created_at", "2026-06-09T14:00:00+02:00").unwrap();
        assert_eq!(a, b);
        let c = Timestamp::parse_rfc3339("created_at", "2026-06-09T12:00:00.123456+00:00").unwrap();
        assert_eq!(c.unix_micros() - a.unix_micros(), 123_456);
        // C-T-2: a timestamp without an offset is a typed error naming the field.
        let e = Timestamp::parse_rfc3339("created_at", "2026-06-09T12:00:00").unwrap_err();
        assert_eq!(e.field, "created_at");
        assert!(Timestamp::parse_rfc3339("created_at", "2026-06-09T12:00:00.1234567Z").is_err());
        assert!(Timestamp::parse_rfc3339("created_at", "2026-06-09T12:00:00.1234560Z").is_ok());
        assert_eq!(c.to_rfc3339(), "2026-06-09T12:00:00.123456Z");
    }
}
