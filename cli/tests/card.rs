//! `abhyasa card` with a backoff cap that is not a whole number of seconds
//! (issue 12): the card advertises the cap rounded down and sizes
//! `max_retries` for it, so it passes its own AB-2 check and exits 0.

mod process;
use process::{abhyasa, free_port, init, json, set_config};

// C-AC-4 / C-A2A-1: every advertised profile is coherent.
#[test]
fn card_with_fractional_backoff_cap_is_coherent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("n");
    init(&dir, "carol", free_port());
    let d = dir.to_str().expect("utf-8");
    for (base_ms, cap_ms) in [("1000", "1500"), ("100", "2500"), ("250", "400")] {
        set_config(&dir, "backoff_base_ms", base_ms);
        set_config(&dir, "backoff_cap_ms", cap_ms);
        let out = abhyasa(&["card", "--dir", d]);
        assert!(
            out.status.success(),
            "cap {cap_ms} ms: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let card = json(&["card", "--dir", d]);
        assert_eq!(card["required"], false);
        let cap: u64 = cap_ms.parse().expect("number");
        for k in card["params"]["supported_kinds"].as_array().expect("kinds") {
            assert_eq!(k["backoff_cap_seconds"], (cap / 1000).max(1), "{k}");
            let deadline = k["deadline_seconds"].as_u64().expect("deadline");
            let base = k["backoff_base_seconds"].as_f64().expect("base");
            let need = abhyasa_core::min_retries_to_span(deadline, base, cap as f64 / 1000.0);
            assert!(k["max_retries"].as_u64().expect("retries") > need, "{k}");
        }
    }
}

// Issue 12, the card tells the truth: when the node serves the HTTP
// binding (`[http]`), the card advertises its https custody_ack_endpoint
// and obligation_endpoints, not the quic:// address (C-A2A-1).
#[test]
fn card_advertises_the_http_binding_when_served() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("n");
    let quic = free_port();
    init(&dir, "dana", quic);
    let d = dir.to_str().expect("utf-8");
    let card = json(&["card", "--dir", d]);
    assert_eq!(
        card["params"]["custody_ack_endpoint"],
        format!("quic://127.0.0.1:{quic}")
    );
    let http = free_port();
    process::pin(&dir, &format!("[http]\nlisten = \"127.0.0.1:{http}\"\n"));
    let card = json(&["card", "--dir", d]);
    let base = format!("https://127.0.0.1:{http}");
    assert_eq!(
        card["params"]["custody_ack_endpoint"],
        format!("{base}/abhyasa/custody_ack"),
        "{card}"
    );
    let kinds = card["params"]["supported_kinds"].as_array().expect("kinds");
    assert!(!kinds.is_empty());
    for k in kinds {
        assert_eq!(
            k["obligation_endpoint"],
            format!("{base}/abhyasa/obligations"),
            "{k}"
        );
    }
    // A public URL (behind a proxy or a DNS name) is what gets advertised.
    let text = std::fs::read_to_string(dir.join("config.toml")).expect("config");
    std::fs::write(
        dir.join("config.toml"),
        text.replace(
            &format!("listen = \"127.0.0.1:{http}\"\n"),
            &format!(
                "listen = \"127.0.0.1:{http}\"\npublic_url = \"https://dana.example:8443/\"\n"
            ),
        ),
    )
    .expect("config written");
    let card = json(&["card", "--dir", d]);
    assert_eq!(
        card["params"]["custody_ack_endpoint"],
        "https://dana.example:8443/abhyasa/custody_ack"
    );
}
