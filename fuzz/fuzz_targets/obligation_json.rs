//! C-T-6 / C-T-5: `Obligation::from_json` over any bytes: a typed error or
//! an obligation whose JSON and protobuf forms decode back to it, with the
//! same digest.
#![no_main]

use abhyasa_core::wire::{Envelope, Message};
use abhyasa_core::{AgentId, Obligation};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(o) = Obligation::from_json(data) else {
        return;
    };
    let back = Obligation::from_json(o.to_json().as_bytes()).expect("own JSON decodes");
    assert_eq!(back, o);
    assert_eq!(back.digest(), o.digest());
    let sender = AgentId::new("fuzz").expect("valid id");
    let env = Envelope::new(sender, Message::Obligation(o));
    let again = Envelope::decode(&env.encode()).expect("own protobuf decodes");
    assert_eq!(again, env);
    let _ = serde_json::from_slice::<Obligation>(data);
});
