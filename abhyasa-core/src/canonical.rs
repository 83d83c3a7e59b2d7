//! Canonical JSON (RFC 8785, JCS) and the content digest.
//!
//! The digest of an obligation is `SHA-256(JCS(o))` where `o` is the JSON
//! object of its eight v1 fields (`obligation_id, kind, target, payload,
//! deadline_seconds, max_retries, created_at, sequence`), `created_at` in its
//! canonical form (UTC, `Z`, six fractional digits) and `sequence` omitted
//! when absent. Any peer with a JCS library can recompute it; test vectors
//! live in `spec/vectors/`.

use std::fmt::Write as _;

use serde_json::{Map, Number, Value};
use sha2::{Digest as _, Sha256};

/// Largest integer magnitude that survives IEEE-754 doubles (I-JSON).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Appends the JCS form of `v` to `out`.
pub fn write_jcs(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_jcs(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => write_object(m, out),
    }
}

/// JCS of an object: members sorted by the UTF-16 code units of their names.
pub fn write_object(m: &Map<String, Value>, out: &mut String) {
    out.push('{');
    // Without serde_json's `preserve_order` (which an embedder may turn
    // on) the map iterates in byte order of the names, and byte order is
    // UTF-16 order unless a name holds a character at or above U+E000
    // (UTF-8 lead bytes 0xEE and up). Sort only when either fails.
    let mut prev: Option<&String> = None;
    let in_order = m.keys().all(|k| {
        let ok = prev.is_none_or(|p| p < k) && k.bytes().all(|b| b < 0xEE);
        prev = Some(k);
        ok
    });
    if in_order {
        for (i, (k, v)) in m.iter().enumerate() {
            member(i, k, v, out);
        }
    } else {
        let mut members: Vec<(&String, &Value)> = m.iter().collect();
        members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
        for (i, (k, v)) in members.into_iter().enumerate() {
            member(i, k, v, out);
        }
    }
    out.push('}');
}

fn member(i: usize, k: &str, v: &Value, out: &mut String) {
    if i > 0 {
        out.push(',');
    }
    write_string(k, out);
    out.push(':');
    write_jcs(v, out);
}

/// Appends the JCS form of the string `s` (RFC 8785 §3.2.2.2): runs of
/// characters that need no escape are copied whole.
pub(crate) fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1f => "",
            _ => continue,
        };
        // Escaped bytes are ASCII, so `run..i` and `i + 1..` are on
        // character boundaries.
        out.push_str(&s[run..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        run = i + 1;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

fn write_number(n: &Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        write_es_number(f, out);
    }
}

/// ECMAScript `Number.prototype.toString` of a finite double (RFC 8785 §3.2.2.3).
pub fn es_number(x: f64) -> String {
    let mut s = String::new();
    write_es_number(x, &mut s);
    s
}

/// Appends [`es_number`]`(x)` to `out`, formatting on the stack: no
/// temporary string per number (a payload's numbers are
/// written on every canonicalization).
pub(crate) fn write_es_number(x: f64, out: &mut String) {
    if x == 0.0 || !x.is_finite() {
        out.push('0');
        return;
    }
    let x = if x < 0.0 {
        out.push('-');
        -x
    } else {
        x
    };
    // An integer below 2^53 (what payloads mostly carry) is its decimal
    // digits: every integer there is a double, so no shorter digit string
    // rounds to it, and ECMAScript writes an integer below 10^21 in full.
    if x < TWO_POW_53 && x.fract() == 0.0 {
        // Exact: x is a whole number in [1, 2^53).
        out.push_str(itoa::Buffer::new().format(x as u64));
        return;
    }
    write_es_digits(x, out);
}

/// 2^53: below it every integer is exactly a double.
const TWO_POW_53: f64 = 9_007_199_254_740_992.0;

/// [`write_es_number`] for a finite `x > 0`, by way of its shortest
/// round-trip digits (the general case).
fn write_es_digits(x: f64, out: &mut String) {
    // zmij (serde_json's float writer) prints the shortest round-trip
    // digits, as `123.45`, `0.0001`, `1.0` or `1.5e-7`: read back the
    // significant digits and the power of ten of the first.
    let mut buf = zmij::Buffer::new();
    let text = buf.format_finite(x);
    let (mant, exp) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (lead, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let mut digits = Stack::default();
    digits.push_str(lead);
    digits.push_str(frac);
    let all = digits.as_str();
    let significant = all.trim_start_matches('0');
    let leading_zeros = (all.len() - significant.len()) as i32;
    let digits = significant.trim_end_matches('0');
    // The power of ten of the first significant digit.
    let e = lead.len() as i32 - 1 + exp - leading_zeros;
    let k = digits.len() as i32;
    let n = e + 1;
    if k <= n && n <= 21 {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(digits);
    } else {
        let sign = if n - 1 < 0 { '-' } else { '+' };
        let ex = (n - 1).abs();
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{sign}{ex}");
    }
}

/// A small string on the stack, for [`write_es_number`]'s digits (ASCII,
/// at most 17 significant digits plus the leading zeros of a form like
/// `0.000123`; anything longer is cut off, which a double's shortest form
/// never is).
#[derive(Default)]
struct Stack {
    buf: [u8; 32],
    len: usize,
}

impl Stack {
    fn push_str(&mut self, s: &str) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
    }

    fn as_str(&self) -> &str {
        // Only whole ASCII strings are pushed, so any prefix is UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl std::fmt::Write for Stack {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// SHA-256 of bytes.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Strings are escaped as RFC 8785 says (serde_json writes the
        /// same escapes), whatever runs of plain and escaped characters.
        #[test]
        fn strings_escape_as_jcs(s in "[a-z\\x00-\\x1f\"\\\\é😀]{0,16}|\\PC{0,8}") {
            let mut out = String::new();
            write_string(&s, &mut out);
            prop_assert_eq!(out, serde_json::to_string(&s).unwrap_or_default());
        }

        /// Members come out in UTF-16 order of their names, also when
        /// byte order differs (characters at or above U+E000).
        #[test]
        fn members_sort_by_utf16(keys in proptest::collection::vec("[a\u{e000}\u{ffff}\u{10000}\u{1f600}]{0,3}|\\PC{0,4}", 0..8)) {
            let m: Map<String, Value> = keys.iter().map(|k| (k.clone(), Value::Null)).collect();
            let mut names: Vec<&String> = m.keys().collect();
            names.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            let mut expected = String::from("{");
            for (i, k) in names.iter().enumerate() {
                if i > 0 {
                    expected.push(',');
                }
                expected.push_str(&serde_json::to_string(k).unwrap_or_default());
                expected.push_str(":null");
            }
            expected.push('}');
            let mut out = String::new();
            write_object(&m, &mut out);
            prop_assert_eq!(out, expected);
        }

        /// Every double, from its bits (subnormals, huge and tiny
        /// exponents included), is written as the plain reference
        /// rendering of §3.2.2.3 writes it, and reads back as itself.
        #[test]
        fn numbers_write_as_the_reference(
            bits in any::<u64>(),
            small in -1e7f64..1e7,
            mant in 1u32..10_000,
            exp in -330i32..310,
            int in 0u64..1 << 53,
            near in 0u64..1 << 12,
            shift in 1i32..20,
        ) {
            // Short mantissas at every exponent: each branch of the
            // rendering, with one digit and with several.
            let short: f64 = format!("{mant}e{exp}").parse().unwrap_or(0.0);
            // Integers of every size, and on both sides of 2^53 (where the
            // integer fast path stops).
            let big = (int | 1 << 52) as f64;
            let edge = [
                ((1u64 << 53) - near) as f64,
                ((1u64 << 53) + 2 * near) as f64,
                // Integers above 2^53, whose shortest digits are fewer
                // than their exact ones.
                big * 2f64.powi(shift),
            ];
            for x in [f64::from_bits(bits), small, small.round(), small / 1024.0, short, -short,
                      int as f64, -(int as f64), big, edge[0], edge[1], edge[2]] {
                if !x.is_finite() {
                    continue;
                }
                let mut out = String::from("[");
                write_es_number(x, &mut out);
                prop_assert_eq!(&out[1..], es_reference(x), "for {:e}", x);
                let back: f64 = out[1..].parse().unwrap_or(f64::NAN);
                prop_assert!(back == x || (x == 0.0 && back == 0.0), "{} for {:e}", out, x);
            }
        }
    }

    /// §3.2.2.3 written plainly, with a temporary string per step: the
    /// reference the stack-buffer writer is held to.
    fn es_reference(x: f64) -> String {
        if x == 0.0 || !x.is_finite() {
            return "0".to_string();
        }
        if x < 0.0 {
            return format!("-{}", es_reference(-x));
        }
        // The fewest digits that read back as x (std's shortest form),
        // then x rounded exactly to that many, ties to even: §7.1.12.1
        // takes, among the shortest digit strings, the one closest to x
        // and the even one of two as close. std's shortest form may pick
        // the odd one of such a pair (1721455037666327.25 is written
        // ...327.3; the rule, and zmij, say ...327.2).
        let shortest = format!("{x:e}");
        let k = shortest
            .split_once('e')
            .map_or(shortest.as_str(), |(m, _)| m)
            .chars()
            .filter(char::is_ascii_digit)
            .count();
        let sci = format!("{x:.*e}", k - 1);
        let (mant, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
        let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
        let e: i32 = exp.parse().unwrap_or(0);
        let k = digits.len() as i32;
        let n = e + 1;
        if k <= n && n <= 21 {
            format!("{digits}{}", "0".repeat((n - k) as usize))
        } else if 0 < n && n <= 21 {
            format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
        } else if -6 < n && n <= 0 {
            format!("0.{}{}", "0".repeat((-n) as usize), digits)
        } else {
            let sign = if n - 1 < 0 { '-' } else { '+' };
            let ex = (n - 1).abs();
            if k == 1 {
                format!("{digits}e{sign}{ex}")
            } else {
                format!("{}.{}e{sign}{ex}", &digits[..1], &digits[1..])
            }
        }
    }

    /// A double exactly halfway between its two shortest digit strings
    /// is written with the even one (§7.1.12.1), as the reference now
    /// says too (a property run found the reference writing the odd one).
    #[test]
    fn a_tie_between_shortest_digits_takes_the_even_one() {
        let x = f64::from_bits(4_834_744_620_691_837_021); // 1721455037666327.25
        assert_eq!(es_number(x), "1721455037666327.2");
        assert_eq!(es_reference(x), "1721455037666327.2");
        assert_eq!(es_number(-x), "-1721455037666327.2");
    }

    /// Seventeen significant digits at every power of ten (the longest
    /// digit strings, across every switch between plain and exponent form
    /// of the digit writer underneath), and one digit.
    #[test]
    fn long_and_short_digits_at_every_exponent() {
        for exp in -324..=308 {
            for m in ["1.2345678901234567", "9.876543210987654", "1", "5", "1.5"] {
                let Ok(x) = format!("{m}e{exp}").parse::<f64>() else {
                    continue;
                };
                if x == 0.0 || !x.is_finite() {
                    continue;
                }
                assert_eq!(es_number(x), es_reference(x), "for {x:e}");
                assert_eq!(es_number(-x), es_reference(-x), "for {:e}", -x);
            }
        }
    }

    #[test]
    fn es_numbers_match_rfc8785_examples() {
        // Values from RFC 8785 appendix B.
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.5, "-1.5"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e-7, "1e-7"),
            (0.000001, "0.000001"),
            (123456789012345680000.0, "123456789012345680000"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.1, "0.1"),
            (333333333.3333333, "333333333.3333333"),
            (9007199254740992.0, "9007199254740992"),
            (295147905179352830000.0, "295147905179352830000"),
            (1.0e23, "1e+23"),
        ];
        for (x, want) in cases {
            assert_eq!(es_number(*x), *want, "for {x:e}");
        }
    }

    #[test]
    fn objects_sort_by_utf16_and_escape_minimally() {
        let v: Value = serde_json::from_str(
            r#"{"b":[1,2.50,{"z":null,"a":true}],"a":"\u00e9\n\u001f","\ud83d\ude00":1,"\ufb33":2}"#,
        )
        .unwrap();
        let mut s = String::new();
        write_jcs(&v, &mut s);
        // U+1F600 is a surrogate pair (0xD83D...) and sorts before U+FB33 in UTF-16.
        assert_eq!(
            s,
            "{\"a\":\"é\\n\\u001f\",\"b\":[1,2.5,{\"a\":true,\"z\":null}],\"😀\":1,\"דּ\":2}"
        );
    }
}
