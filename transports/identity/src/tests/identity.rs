use std::path::PathBuf;

use super::*;
use crate::{verify_signature, Fingerprint, IdentityError, PinError, PinSet, SignatureError};

fn scratch_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "abhyasa-identity-{name}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn pem_round_trip_keeps_the_fingerprint() {
    let me = identity(&id("node-a"));
    let (cert, key) = me.to_pem();
    assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    let back = Identity::from_pem(&cert, &key).expect("parses");
    assert_eq!(back.fingerprint, me.fingerprint);
    assert_eq!(back.fingerprint, Fingerprint::of(&back.cert_der));
    assert!(
        !format!("{me:?}").contains(&key[30..60]),
        "Debug must not print the key"
    );
}

#[test]
fn files_are_saved_owner_only_and_never_overwritten() {
    let dir = scratch_dir("pem");
    let (cert, key) = (dir.join("node.crt"), dir.join("node.key"));
    let me = identity(&id("node-a"));
    me.save_pem(&cert, &key).expect("saved");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key)
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let loaded = Identity::load_pem(&cert, &key).expect("loads");
    assert_eq!(loaded.fingerprint, me.fingerprint);
    let other = identity(&id("node-a"));
    assert!(matches!(
        other.save_pem(&cert, &key),
        Err(IdentityError::Io { .. })
    ));
    assert_eq!(
        Identity::load_pem(&cert, &key)
            .expect("still loads")
            .fingerprint,
        me.fingerprint
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_key_from_another_identity_is_refused() {
    let a = identity(&id("a"));
    let b = identity(&id("b"));
    let (cert_a, _) = a.to_pem();
    let (_, key_b) = b.to_pem();
    assert!(matches!(
        Identity::from_pem(&cert_a, &key_b),
        Err(IdentityError::KeyMismatch)
    ));
    assert!(matches!(
        Identity::from_pem(&cert_a, &cert_a),
        Err(IdentityError::Pem { .. })
    ));
    assert!(matches!(
        Identity::from_pem("junk", "junk"),
        Err(IdentityError::Pem { .. })
    ));
}

#[test]
fn signatures_verify_only_against_the_signers_certificate() {
    let a = identity(&id("a"));
    let b = identity(&id("b"));
    let sig = a.sign(b"hello").expect("signs");
    assert_eq!(verify_signature(&a.cert_der, b"hello", &sig), Ok(()));
    assert_eq!(
        verify_signature(&a.cert_der, b"hellO", &sig),
        Err(SignatureError::Invalid)
    );
    assert_eq!(
        verify_signature(&b.cert_der, b"hello", &sig),
        Err(SignatureError::Invalid)
    );
    assert!(matches!(
        verify_signature(b"not a cert", b"hello", &sig),
        Err(SignatureError::Certificate(_))
    ));
}

#[test]
fn fingerprints_parse_in_common_spellings() {
    let fp = identity(&id("a")).fingerprint;
    let hex = fp.to_hex();
    let colons = hex
        .as_bytes()
        .chunks(2)
        .map(|c| std::str::from_utf8(c).expect("ascii"))
        .collect::<Vec<_>>()
        .join(":")
        .to_uppercase();
    for s in [hex.clone(), format!("sha256:{hex}"), colons] {
        assert_eq!(s.parse::<Fingerprint>(), Ok(fp), "{s}");
    }
    assert!("abcd".parse::<Fingerprint>().is_err());
    assert!(format!("{hex}00").parse::<Fingerprint>().is_err());
}

#[test]
fn pin_sets_reject_ambiguity() {
    let (a, b) = (identity(&id("a")), identity(&id("b")));
    let me = id("me");
    assert!(PinSet::new(&me, &[a.pin(id("a")), b.pin(id("b"))]).is_ok());
    assert_eq!(
        PinSet::new(&me, &[a.pin(id("a")), b.pin(id("a"))]).err(),
        Some(PinError::DuplicateAgent(id("a")))
    );
    assert!(matches!(
        PinSet::new(&me, &[a.pin(id("a")), a.pin(id("b"))]),
        Err(PinError::DuplicateFingerprint { .. })
    ));
    assert_eq!(
        PinSet::new(&me, &[a.pin(id("me"))]).err(),
        Some(PinError::SelfPin(id("me")))
    );
}
