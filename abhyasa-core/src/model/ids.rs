//! Identity newtypes. Never bare `String`/`u64` in public signatures.

use std::fmt;
use std::sync::Arc;

use crate::error::{FieldError, FieldProblem};

/// Longest identifier accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;

fn check_id(field: &str, s: &str, max: usize) -> Result<(), FieldError> {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return Err(FieldError::new(field, FieldProblem::Empty));
    };
    // Nearly every id is printable ASCII, where the only white space is
    // the space and there is no control character: one pass over the
    // bytes decides it, instead of decoding characters twice (ids are
    // checked a dozen times per obligation). Anything else takes
    // the general rules; both agree on every string (property below).
    let printable = b.iter().all(|c| (0x20..0x7f).contains(c));
    let padded = if printable {
        *first == b' ' || *last == b' '
    } else {
        s.trim() != s
    };
    if padded {
        return Err(FieldError::new(field, FieldProblem::Padded));
    }
    if s.len() > max {
        return Err(FieldError::new(field, FieldProblem::TooLong { max }));
    }
    if !printable && s.chars().any(char::is_control) {
        return Err(FieldError::new(field, FieldProblem::ControlCharacter));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        string_id!($(#[$doc])* $name, $field, MAX_ID_BYTES);
    };
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:expr) => {
        $(#[$doc])*
        ///
        /// Non-empty, no leading/trailing white space, no control
        /// characters, at most [`MAX_ID_BYTES`] bytes. Cheap to clone.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates and wraps an identifier.
            pub fn new(s: impl AsRef<str>) -> Result<Self, FieldError> {
                Self::parse_field($field, s.as_ref())
            }

            /// Validates, naming `field` in the error.
            pub fn parse_field(field: &str, s: &str) -> Result<Self, FieldError> {
                check_id(field, s, $max)?;
                Ok(Self(Arc::from(s)))
            }

            /// The identifier as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = FieldError;
            fn from_str(s: &str) -> Result<Self, FieldError> {
                Self::new(s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::new(&*s).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// Stable identifier of an obligation; the AB-3 idempotency key
    /// (together with the authenticated custodian).
    ObligationId,
    "obligation_id"
);
string_id!(
    /// Identifier of an agent (custodian, receiver, principal).
    AgentId,
    "target"
);
string_id!(
    /// Obligation kind; selects the polarity rule (e.g. `anumati.consent`).
    Kind,
    "kind"
);
string_id!(
    /// The state an obligation governs (a consent scope, a routing weight, a
    /// token), namespaced by kind and target so two different things never
    /// share a key. Polarity rules build the issuer-less form
    /// `kind/target/name`; a receiver holds every key under its issuer
    /// ([`GovernedKey::issued_by`]), so one peer's obligation never touches
    /// another's state. At most [`MAX_KEY_BYTES`] bytes.
    GovernedKey,
    "key",
    MAX_KEY_BYTES
);

/// Longest governed key: an issuer id (each byte at most three once
/// escaped), its marker and separator, and an issuer-less key.
pub const MAX_KEY_BYTES: usize = 4 * MAX_ID_BYTES + 2;

/// The first byte of a governed key held under its issuer.
const ISSUER_MARK: char = '@';

impl GovernedKey {
    /// This key held under `issuer`: `@<issuer>/<key>`, where the issuer's
    /// `%` and `/` are escaped (`%25`, `%2F`) so the first `/` ends it and
    /// two (issuer, key) pairs never share a string. A key already held
    /// under an issuer is returned unchanged.
    pub fn issued_by(&self, issuer: &AgentId) -> GovernedKey {
        if self.issuer_part().is_some() {
            return self.clone();
        }
        #[cfg(feature = "mutations")]
        if crate::mutations::active(crate::mutations::Mutation::IssuerNotInKey) {
            return self.clone();
        }
        let mut s = String::with_capacity(self.0.len() + issuer.as_str().len() + 2);
        s.push(ISSUER_MARK);
        for c in issuer.as_str().chars() {
            match c {
                '%' => s.push_str("%25"),
                '/' => s.push_str("%2F"),
                c => s.push(c),
            }
        }
        s.push('/');
        s.push_str(&self.0);
        // Both parts passed the id rules (no control character, no
        // padding) and the length fits MAX_KEY_BYTES by construction.
        GovernedKey(Arc::from(s))
    }

    /// The escaped issuer part and the issuer-less key, if this key is held
    /// under an issuer.
    fn issuer_part(&self) -> Option<(&str, &str)> {
        self.0.strip_prefix(ISSUER_MARK)?.split_once('/')
    }

    /// The issuer this key is held under, if any.
    pub fn issuer(&self) -> Option<AgentId> {
        let (escaped, _) = self.issuer_part()?;
        let raw = escaped.replace("%2F", "/").replace("%25", "%");
        AgentId::new(raw).ok()
    }

    /// The issuer-less key (`kind/target/name`): the key itself when it is
    /// not held under an issuer.
    pub fn unqualified(&self) -> &str {
        self.issuer_part().map_or(&self.0, |(_, k)| k)
    }
}

/// Issuance order of obligations on one governed key (supersession guard).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Sequence(pub u64);

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// SHA-256 content digest of an obligation's immutable fields.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Parses 64 lowercase or uppercase hex digits.
    pub fn from_hex(field: &str, s: &str) -> Result<Self, FieldError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| {
            FieldError::invalid(field, format!("not a 64-digit hex SHA-256 digest: {e}"))
        })?;
        Ok(Self(out))
    }

    /// Parses 32 raw bytes.
    pub fn from_slice(field: &str, b: &[u8]) -> Result<Self, FieldError> {
        let arr: [u8; 32] = b.try_into().map_err(|_| {
            FieldError::invalid(field, format!("digest must be 32 bytes, found {}", b.len()))
        })?;
        Ok(Self(arr))
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 8 bytes as a number (for seeding per-obligation streams).
    pub fn prefix_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.to_hex()[..16])
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex("digest", &s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // C-T-2: empty and padded ids are typed errors naming the field.
    #[test]
    fn ids_reject_empty_padded_long_and_control() {
        assert_eq!(
            ObligationId::new("").unwrap_err().problem,
            FieldProblem::Empty
        );
        assert_eq!(
            ObligationId::new(" a").unwrap_err().problem,
            FieldProblem::Padded
        );
        assert_eq!(
            ObligationId::new("a\t").unwrap_err().problem,
            FieldProblem::Padded
        );
        assert_eq!(
            AgentId::new("a\u{7}b").unwrap_err().problem,
            FieldProblem::ControlCharacter
        );
        let long = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(
            Kind::new(&long).unwrap_err().problem,
            FieldProblem::TooLong { max: MAX_ID_BYTES }
        );
        assert_eq!(ObligationId::new("").unwrap_err().field, "obligation_id");
        assert!(ObligationId::new("ob-1").is_ok());
    }

    /// The rules as written in the type's docs, one by one.
    fn check_id_by_the_rules(s: &str) -> Result<(), FieldProblem> {
        if s.is_empty() {
            return Err(FieldProblem::Empty);
        }
        if s.trim() != s {
            return Err(FieldProblem::Padded);
        }
        if s.len() > MAX_ID_BYTES {
            return Err(FieldProblem::TooLong { max: MAX_ID_BYTES });
        }
        if s.chars().any(char::is_control) {
            return Err(FieldProblem::ControlCharacter);
        }
        Ok(())
    }

    proptest::proptest! {
        // The printable-ASCII fast path decides exactly as the rules do,
        // on ASCII-heavy strings (the fast path's domain and its edges:
        // spaces, tabs, DEL, other white space), on long ones and on any.
        #[test]
        fn check_id_agrees_with_the_rules(
            s in "[ -~\t\u{7f}\u{a0}\u{2003}\u{85}]{0,8}|[a-z -]{0,300}|\\PC{0,6}|.{0,6}"
        ) {
            proptest::prop_assert_eq!(
                check_id("id", &s, MAX_ID_BYTES).map_err(|e| e.problem),
                check_id_by_the_rules(&s)
            );
        }
    }

    #[test]
    fn digest_hex_round_trip() {
        let d = Digest([0xab; 32]);
        assert_eq!(Digest::from_hex("digest", &d.to_hex()).unwrap(), d);
        assert!(Digest::from_hex("digest", "abc").is_err());
    }
}
