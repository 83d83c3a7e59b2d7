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
        let mut out = String::with_capacity(RFC3339_LEN);
        self.write_rfc3339(&mut out);
        out
    }

    /// Appends [`Timestamp::to_rfc3339`] to `out`. The text is plain ASCII
    /// (digits, `-`, `+`, `:`, `.`, `T`, `Z`): it needs no JSON escaping.
    ///
    /// Four-digit years (every timestamp an obligation can carry) are
    /// written directly — this runs twice per obligation, inside its
    /// digest; others go through chrono, which the direct form is
    /// property-tested against.
    pub fn write_rfc3339(self, out: &mut String) {
        if self < Self::RFC3339_MIN || self > Self::RFC3339_MAX {
            out.push_str(&self.by_chrono());
            return;
        }
        const DAY_US: i64 = 86_400_000_000;
        let days = self.0.div_euclid(DAY_US);
        let in_day = self.0.rem_euclid(DAY_US);
        let (year, month, day) = civil_from_days(days);
        let secs = in_day / 1_000_000;
        let micros = in_day % 1_000_000;
        let mut b = *b"0000-00-00T00:00:00.000000Z";
        put_digits(&mut b[0..4], year);
        put_digits(&mut b[5..7], month);
        put_digits(&mut b[8..10], day);
        put_digits(&mut b[11..13], secs / 3600);
        put_digits(&mut b[14..16], secs / 60 % 60);
        put_digits(&mut b[17..19], secs % 60);
        put_digits(&mut b[20..26], micros);
        // Only ASCII digits were written over an ASCII template.
        out.push_str(std::str::from_utf8(&b).unwrap_or_default());
    }

    /// [`Timestamp::to_rfc3339`] through chrono: the form for years
    /// outside four digits, and the reference the direct form is held to.
    fn by_chrono(self) -> String {
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

/// The length of a four-digit-year [`Timestamp::to_rfc3339`].
const RFC3339_LEN: usize = 27;

/// Writes `n` (non-negative, fewer digits than `out` is long) into `out`
/// as zero-padded decimal.
fn put_digits(out: &mut [u8], mut n: i64) {
    for d in out.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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

    #[test]
    fn the_edges_of_four_digit_years_and_of_days() {
        for us in [
            Timestamp::RFC3339_MIN.0,
            Timestamp::RFC3339_MIN.0 + 1,
            Timestamp::RFC3339_MAX.0,
            Timestamp::RFC3339_MAX.0 - 1,
            Timestamp::RFC3339_MIN.0 - 1,
            Timestamp::RFC3339_MAX.0 + 1,
            0,
            -1,
            1,
            86_400_000_000 - 1,
            -86_400_000_000,
            951_782_400_000_000,   // 2000-02-29
            4_107_542_400_000_000, // 2100-03-01 (2100 is not a leap year)
            -2_203_891_200_000_001,
            i64::MIN,
            i64::MAX,
        ] {
            let t = Timestamp(us);
            assert_eq!(t.to_rfc3339(), t.by_chrono(), "{us}");
        }
        assert_eq!(
            Timestamp::RFC3339_MIN.to_rfc3339(),
            "0000-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            Timestamp::RFC3339_MAX.to_rfc3339(),
            "9999-12-31T23:59:59.999999Z"
        );
    }

    proptest::proptest! {
        #[test]
        fn writes_what_chrono_writes(
            us in Timestamp::RFC3339_MIN.0 - 1_000_000..=Timestamp::RFC3339_MAX.0 + 1_000_000,
        ) {
            let t = Timestamp(us);
            proptest::prop_assert_eq!(t.to_rfc3339(), t.by_chrono());
        }

        #[test]
        fn writes_what_chrono_writes_anywhere(us: i64) {
            let t = Timestamp(us);
            proptest::prop_assert_eq!(t.to_rfc3339(), t.by_chrono());
        }
    }
}
