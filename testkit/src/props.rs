//! Strategies for arbitrary obligations, shared by the core's round-trip
//! properties and the store properties (C-T-5).
//!
//! The generators aim at what broke or could break a codec: numbers across
//! the whole f64 range (subnormals, ±0, integral doubles at and past 2^53,
//! the 1e21 switch to exponent form, the largest finite values, random bit
//! patterns), integers past the I-JSON range, strings with control
//! characters, quotes, backslashes, U+2028 and astral-plane characters,
//! nesting, and every offset form of an RFC 3339 timestamp.

use std::collections::BTreeMap;

use abhyasa_core::polarity::{ANUMATI_KIND, OAUTH_KIND, PHALA_KIND};
use abhyasa_core::{FieldError, Obligation, Timestamp, MAX_ID_BYTES};
use chrono::{DateTime, FixedOffset, Utc};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Largest integer magnitude inside the I-JSON range.
pub const MAX_SAFE: u64 = (1 << 53) - 1;

/// `0000-01-01T00:00:00Z` in microseconds: the first instant RFC 3339 can
/// write (four-digit years).
pub const RFC3339_MIN_MICROS: i64 = -62_167_219_200_000_000;
/// `9999-12-31T23:59:59.999999Z` in microseconds: the last such instant.
pub const RFC3339_MAX_MICROS: i64 = 253_402_300_799_999_999;

/// Case count for a property: `PROPTEST_CASES` when set (heavier local
/// runs), else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A bounded config: `default` cases (or `PROPTEST_CASES`), and no
/// regression files written into the source tree (the cases worth keeping
/// are written out as named tests).
pub fn config(default: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: cases(default),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// Characters that stress string escaping and UTF-16 key ordering.
fn special_char() -> impl Strategy<Value = char> {
    prop::sample::select(vec![
        '"',
        '\\',
        '/',
        '\u{0}',
        '\u{8}',
        '\u{c}',
        '\n',
        '\r',
        '\t',
        '\u{1f}',
        '\u{7f}',
        '\u{80}',
        '\u{9f}',
        '\u{a0}',
        '\u{2028}',
        '\u{2029}',
        '\u{feff}',
        '\u{fffd}',
        '\u{ffff}',
        '\u{10000}',
        '\u{1f600}',
        '\u{10ffff}',
        '\u{e9}',
        '\u{fb33}',
        ' ',
    ])
}

/// Any character, weighted towards the ones that need care.
pub fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::char::range('a', 'z'),
        2 => special_char(),
        2 => any::<char>(),
    ]
}

/// Arbitrary text (may contain control characters): payload strings and keys.
pub fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(any_char(), 0..12).prop_map(String::from_iter)
}

fn id_is_valid(s: &str) -> bool {
    !s.is_empty() && s.trim() == s && s.len() <= MAX_ID_BYTES && !s.chars().any(char::is_control)
}

/// A valid identifier (see `model/ids.rs`): unicode allowed, no control
/// characters, no padding, at most `MAX_ID_BYTES` bytes.
pub fn id_string() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec(any_char(), 1..16)
            .prop_map(|cs| cs.into_iter().filter(|c| !c.is_control()).collect::<String>())
            .prop_map(|s| s.trim().to_string())
            .prop_filter("valid id", |s| id_is_valid(s)),
        // The longest ids: 256 bytes of mixed widths.
        1 => prop::collection::vec(prop::sample::select(vec!['x', '\u{e9}', '\u{20ac}', '\u{1f600}']), 64..=256)
            .prop_map(|cs| {
                let mut s = String::new();
                for c in cs {
                    if s.len() + c.len_utf8() > MAX_ID_BYTES {
                        break;
                    }
                    s.push(c);
                }
                s
            }),
    ]
}

/// An id that is usually valid and sometimes not (empty, padded, control
/// character, too long), so refusals are exercised too.
pub fn maybe_id() -> impl Strategy<Value = String> {
    prop_oneof![
        60 => id_string(),
        1 => Just(String::new()),
        1 => id_string().prop_map(|s| format!(" {s}")),
        1 => id_string().prop_map(|s| format!("{s}\u{7}x")),
        1 => Just("y".repeat(MAX_ID_BYTES + 1)),
    ]
}

/// A kind: the standard three or any valid id.
pub fn kind() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(ANUMATI_KIND.to_string()),
        Just(PHALA_KIND.to_string()),
        Just(OAUTH_KIND.to_string()),
        id_string(),
    ]
}

/// Doubles that sit on a codec boundary.
pub fn special_f64() -> impl Strategy<Value = f64> {
    let two53 = 9_007_199_254_740_992.0_f64;
    prop::sample::select(vec![
        0.0,
        -0.0,
        f64::from_bits(1), // smallest subnormal
        -f64::from_bits(1),
        f64::from_bits(0x000f_ffff_ffff_ffff), // largest subnormal
        f64::MIN_POSITIVE,
        f64::EPSILON,
        f64::MAX,
        f64::MIN,
        1e21,
        f64::from_bits(1e21_f64.to_bits() - 1),
        f64::from_bits(1e21_f64.to_bits() + 1),
        1e20,
        1e-6,
        1e-7,
        f64::from_bits(1e-6_f64.to_bits() - 1),
        two53 - 1.0,
        two53,
        two53 + 2.0,
        -two53,
        1e16,
        -1e16,
        2f64.powi(60),
        2f64.powi(63),
        2f64.powi(64),
        -2f64.powi(63),
        1e300,
        123_456_789_012_345_680_000.0,
        295_147_905_179_352_830_000.0,
        333_333_333.333_333_3,
        0.1,
        -0.962_504_341_558_015_1,
        -0.930_144_576_425_381_1,
        -0.422_897_051_382_501_33,
        -0.019_825_152_507_417_898,
    ])
}

/// Any finite double: boundary values, random bit patterns (every exponent,
/// subnormals included), integral doubles past 2^53, and plain fractions.
pub fn finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => special_f64(),
        3 => any::<u64>()
            .prop_map(f64::from_bits)
            .prop_filter("finite", |x| x.is_finite()),
        1 => (0u64..(1 << 52)).prop_map(f64::from_bits), // subnormals
        2 => (53i32..=1023, any::<u64>(), any::<bool>()).prop_map(|(e, m, neg)| {
            // An integral double of magnitude 2^e.
            let mant = 1.0 + ((m >> 12) as f64) / (1u64 << 52) as f64;
            let x = mant * 2f64.powi(e);
            if neg { -x } else { x }
        }),
        2 => -1.0f64..1.0,
        1 => -1e6f64..1e6,
    ]
}

/// Integers, inside and outside the I-JSON range.
pub fn integer() -> impl Strategy<Value = Value> {
    let safe = MAX_SAFE as i64;
    prop_oneof![
        6 => (-1000i64..1000).prop_map(Value::from),
        4 => (-safe..=safe).prop_map(Value::from),
        2 => prop::sample::select(vec![
            Value::from(safe),
            Value::from(-safe),
            Value::from(safe + 1),
            Value::from(-safe - 1),
            Value::from(1i64 << 60),
            Value::from(i64::MAX),
            Value::from(i64::MIN),
            Value::from(u64::MAX),
            Value::from(1u64 << 63),
            Value::from(10_000_000_000_000_000u64),
        ]),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
    ]
}

/// A JSON number: a double or an integer.
pub fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => finite_f64().prop_map(Value::from),
        1 => integer(),
    ]
}

/// A payload value, nested up to four levels below the payload object.
pub fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        4 => number(),
        3 => text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A payload object (depth up to five).
pub fn payload() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(text(), value(), 0..6).prop_map(|m| m.into_iter().collect())
}

/// The latest `created_at` whose absolute deadline still prints as RFC
/// 3339 whatever the deadline.
pub const LATEST_CREATED_AT_MICROS: i64 =
    RFC3339_MAX_MICROS - abhyasa_core::MAX_DEADLINE_SECONDS as i64 * 1_000_000;

/// Timestamps, weighted towards the present and the ends of what RFC 3339
/// can write (years 0000..=9999), with a few beyond (which the builder may
/// refuse, naming `created_at`).
pub fn timestamp() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        8 => (1_700_000_000_000_000i64..1_900_000_000_000_000).prop_map(Timestamp::from_unix_micros),
        2 => (1_700_000_000i64..1_900_000_000).prop_map(Timestamp::from_unix_seconds),
        4 => (RFC3339_MIN_MICROS..=LATEST_CREATED_AT_MICROS).prop_map(Timestamp::from_unix_micros),
        2 => prop::sample::select(vec![
            RFC3339_MIN_MICROS,
            LATEST_CREATED_AT_MICROS,
            RFC3339_MAX_MICROS,
            0,
            -1,
            1,
        ])
        .prop_map(Timestamp::from_unix_micros),
        1 => any::<i64>().prop_map(Timestamp::from_unix_micros),
    ]
}

/// Whether `t` is a `created_at` the builder must accept.
pub fn created_at_in_range(t: Timestamp) -> bool {
    (RFC3339_MIN_MICROS..=LATEST_CREATED_AT_MICROS).contains(&t.unix_micros())
}

/// The fields of an obligation before the builder sees them.
#[derive(Clone, Debug)]
pub struct Spec {
    /// `obligation_id`.
    pub id: String,
    /// `kind`.
    pub kind: String,
    /// `target`.
    pub target: String,
    /// `payload`.
    pub payload: Map<String, Value>,
    /// `deadline_seconds`.
    pub deadline_seconds: i64,
    /// `max_retries`.
    pub max_retries: i64,
    /// `created_at`.
    pub created_at: Timestamp,
    /// `sequence`, if any.
    pub sequence: Option<u64>,
}

impl Spec {
    /// Runs the real builder.
    pub fn build(&self) -> Result<Obligation, FieldError> {
        let mut b = Obligation::builder()
            .id(self.id.as_str())
            .kind(self.kind.as_str())
            .target(self.target.as_str())
            .payload(Value::Object(self.payload.clone()))
            .deadline_seconds(self.deadline_seconds)
            .max_retries(self.max_retries)
            .created_at(self.created_at);
        if let Some(s) = self.sequence {
            b = b.sequence(s);
        }
        b.build()
    }
}

/// Deadlines: mostly valid, sometimes out of range (zero, negative, absurd).
pub fn deadline_seconds() -> impl Strategy<Value = i64> {
    let max = abhyasa_core::MAX_DEADLINE_SECONDS as i64;
    prop_oneof![
        20 => 1i64..=max,
        4 => prop::sample::select(vec![1, 60, 3600, max]),
        1 => prop::sample::select(vec![0, -1, max + 1, i64::MIN, i64::MAX]),
    ]
}

/// Retry bounds: mostly valid, sometimes out of range.
pub fn max_retries() -> impl Strategy<Value = i64> {
    let max = i64::from(abhyasa_core::MAX_RETRIES_LIMIT);
    prop_oneof![
        25 => 0i64..=max,
        1 => prop::sample::select(vec![-1, max + 1, i64::MAX]),
    ]
}

/// An arbitrary obligation spec (usually valid).
pub fn spec() -> impl Strategy<Value = Spec> {
    (
        maybe_id(),
        kind(),
        maybe_id(),
        payload(),
        deadline_seconds(),
        max_retries(),
        timestamp(),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(id, kind, target, payload, deadline_seconds, max_retries, created_at, sequence)| {
                Spec {
                    id,
                    kind,
                    target,
                    payload,
                    deadline_seconds,
                    max_retries,
                    created_at,
                    sequence,
                }
            },
        )
}

/// The paths (`payload.a[2].b`, as the builder names them) of the integers
/// outside ±(2^53-1): the only numbers the builder may refuse.
pub fn wide_integer_paths(payload: &Map<String, Value>) -> Vec<String> {
    fn walk(v: &Value, path: String, out: &mut Vec<String>) {
        match v {
            Value::Number(n) => {
                let wide = match (n.as_i64(), n.as_u64()) {
                    (Some(i), _) => i.unsigned_abs() > MAX_SAFE,
                    (None, Some(u)) => u > MAX_SAFE,
                    (None, None) => false,
                };
                if wide {
                    out.push(path);
                }
            }
            Value::Array(a) => {
                for (i, item) in a.iter().enumerate() {
                    walk(item, format!("{path}[{i}]"), out);
                }
            }
            Value::Object(m) => {
                for (k, item) in m {
                    walk(item, format!("{path}.{k}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (k, v) in payload {
        walk(v, format!("payload.{k}"), &mut out);
    }
    out
}

/// How to write an instant in RFC 3339: offset in minutes east of UTC
/// (`None` for `Z`), lower-case `t`/`z`, a space separator, `-00:00`, and the
/// number of fractional digits (padded with zeros past the significant
/// ones; never fewer than the value needs).
#[derive(Clone, Debug)]
pub struct Rfc3339Form {
    /// Minutes east of UTC; `None` writes `Z`.
    pub offset_minutes: Option<i32>,
    /// Lower-case `t` and `z`.
    pub lower_case: bool,
    /// A space instead of `T`.
    pub space: bool,
    /// `-00:00` for a zero offset.
    pub minus_zero: bool,
    /// Fractional digits written.
    pub digits: usize,
}

/// Every offset form the JSON parser accepts.
pub fn rfc3339_form() -> impl Strategy<Value = Rfc3339Form> {
    (
        prop_oneof![
            1 => Just(None),
            1 => Just(Some(0)),
            3 => (-(23 * 60 + 59)..=(23 * 60 + 59)).prop_map(Some),
        ],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0usize..=9,
    )
        .prop_map(
            |(offset_minutes, lower_case, space, minus_zero, digits)| Rfc3339Form {
                offset_minutes,
                lower_case,
                space,
                minus_zero,
                digits,
            },
        )
}

impl Rfc3339Form {
    /// Writes `t` in this form (an equal instant, a different text).
    /// `None` when the local time in this offset leaves years 0000..=9999.
    pub fn write(&self, t: Timestamp) -> Option<String> {
        let utc: DateTime<Utc> = DateTime::from_timestamp_micros(t.unix_micros())?;
        let offset_secs = self.offset_minutes.unwrap_or(0) * 60;
        let local = utc.with_timezone(&FixedOffset::east_opt(offset_secs)?);
        let naive = local.naive_local();
        let year = chrono::Datelike::year(&naive);
        if !(0..=9999).contains(&year) {
            return None;
        }
        let micros = t.unix_micros().rem_euclid(1_000_000);
        let mut frac = format!("{micros:06}");
        let needed = frac.trim_end_matches('0').len();
        let digits = self.digits.max(needed);
        while frac.len() < digits {
            frac.push('0');
        }
        frac.truncate(digits);
        let sep = match (self.space, self.lower_case) {
            (true, _) => ' ',
            (false, true) => 't',
            (false, false) => 'T',
        };
        let mut s = format!(
            "{}{sep}{}",
            naive.format("%Y-%m-%d"),
            naive.format("%H:%M:%S")
        );
        if !frac.is_empty() {
            s.push('.');
            s.push_str(&frac);
        }
        match self.offset_minutes {
            None => s.push(if self.lower_case { 'z' } else { 'Z' }),
            Some(m) => {
                // `-00:00` is RFC 3339's "offset unknown": the same instant.
                let sign = if m < 0 || (m == 0 && self.minus_zero) {
                    '-'
                } else {
                    '+'
                };
                s.push_str(&format!("{sign}{:02}:{:02}", m.abs() / 60, m.abs() % 60));
            }
        }
        Some(s)
    }
}

/// A map with a key per generated entry, for batches of distinct ids.
pub fn distinct_by_id(specs: Vec<Spec>) -> Vec<Spec> {
    let mut seen = BTreeMap::new();
    for s in specs {
        seen.entry(s.id.clone()).or_insert(s);
    }
    seen.into_values().collect()
}
