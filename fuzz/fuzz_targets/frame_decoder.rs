//! C-T-6: `FrameDecoder` over any bytes, split into chunks and with a frame
//! limit both chosen by the input's first bytes. Never panics, never
//! answers without consuming input, and every envelope it yields
//! re-encodes to an equal one.
#![no_main]

use abhyasa_core::wire::{Envelope, FrameDecoder, DEFAULT_MAX_FRAME};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (head, stream) = data.split_at(data.len().min(2));
    let max_frame = match head.first() {
        Some(&b) if b < 128 => usize::from(b) * 4,
        _ => DEFAULT_MAX_FRAME,
    };
    let chunk = usize::from(head.get(1).copied().unwrap_or(0)).max(1);
    let mut dec = FrameDecoder::new(max_frame);
    let mut buf = BytesMut::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.len();
            let Some(r) = dec.decode(&mut buf) else { break };
            assert!(buf.len() < before, "an answer consumed nothing");
            if let Ok(env) = r {
                let again = Envelope::decode(&env.encode()).expect("re-encoding decodes");
                assert_eq!(again, env);
            }
        }
    }
});
