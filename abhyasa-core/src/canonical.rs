//! Canonical JSON (RFC 8785, JCS) and the content digest.
//!
//! The digest of an obligation is `SHA-256(JCS(o))` where `o` is the JSON
//! object of its eight v1 fields (`obligation_id, kind, target, payload,
//! deadline_seconds, max_retries, created_at, sequence`), `created_at` in its
//! canonical form (UTC, `Z`, six fractional digits) and `sequence` omitted
//! when absent. Any peer with a JCS library can recompute it; test vectors
//! live in `spec/vectors/`.

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
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
    out.push('{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(k, out);
        out.push(':');
        if let Some(v) = m.get(k) {
            write_jcs(v, out);
        }
    }
    out.push('}');
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(n: &Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&es_number(f));
    }
}

/// ECMAScript `Number.prototype.toString` of a finite double (RFC 8785 §3.2.2.3).
pub fn es_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return "0".to_string();
    }
    if x < 0.0 {
        return format!("-{}", es_number(-x));
    }
    // Rust's `{:e}` prints the shortest round-trip digits: d[.ddd]e<exp>.
    let sci = format!("{x:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let e: i32 = exp.parse().unwrap_or(0);
    let k = digits.len() as i32;
    let n = e + 1;
    if k <= n && n <= 21 {
        let mut s = digits;
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
        s
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

/// SHA-256 of bytes.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

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
