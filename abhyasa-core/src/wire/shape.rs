//! Frame shaping: a coalesced message too large for one frame goes out in
//! parts.
//!
//! Acks, status queries and status replies are coalesced (many items, one
//! frame); a transport refuses a frame over its budget. Such a message is
//! split in halves, in order, until each part fits; a part holding one
//! item that still does not fit is refused as it is (nothing can shrink
//! it). Every item goes out exactly once, in its original order.

use super::message::{Envelope, Message, StatusReply};
use crate::model::AgentId;

/// Splits a coalesced message into two halves, in order; `None` when it
/// holds one item (or is not a coalesced kind).
pub fn split_in_half(m: Message) -> Option<(Message, Message)> {
    match m {
        Message::Acks(mut acks) if acks.len() > 1 => {
            let rest = acks.split_off(acks.len() / 2);
            Some((Message::Acks(acks), Message::Acks(rest)))
        }
        Message::StatusQuery(mut ids) if ids.len() > 1 => {
            let rest = ids.split_off(ids.len() / 2);
            Some((Message::StatusQuery(ids), Message::StatusQuery(rest)))
        }
        Message::StatusReply(mut r) if r.known.len() + r.unknown.len() > 1 => {
            let half = (r.known.len() + r.unknown.len()) / 2;
            let known_first = half.min(r.known.len());
            let known = r.known.split_off(known_first);
            let unknown = r.unknown.split_off(half - known_first);
            let second = StatusReply {
                target: r.target.clone(),
                known,
                unknown,
            };
            Some((Message::StatusReply(r), Message::StatusReply(second)))
        }
        _ => None,
    }
}

/// Sends `message` from `sender` through `send`, in parts where needed:
/// each time `send` refuses a part with an error `too_large` accepts, the
/// part is split in halves ([`split_in_half`]) and both are sent, first
/// half first. Counts the splits in `splits`. Returns the first error of
/// any part (every other part was still offered to `send`).
pub fn send_in_parts<E>(
    sender: &AgentId,
    message: Message,
    send: &mut impl FnMut(&Envelope) -> Result<(), E>,
    too_large: &impl Fn(&E) -> bool,
    splits: &mut u64,
) -> Result<(), E> {
    let env = Envelope::new(sender.clone(), message);
    match send(&env) {
        Ok(()) => Ok(()),
        Err(e) if too_large(&e) => match split_in_half(env.message) {
            Some((a, b)) => {
                *splits += 1;
                let first = send_in_parts(sender, a, send, too_large, splits);
                let second = send_in_parts(sender, b, send, too_large, splits);
                first.and(second)
            }
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// `message` from `sender` as the parts a frame budget of `max_frame`
/// encoded bytes (the protobuf envelope, no length prefix) lets through:
/// what [`send_in_parts`] sends to a transport with that budget. A part of
/// one item over the budget is kept as it is (the transport refuses it).
pub fn fit_to_frame(sender: &AgentId, message: Message, max_frame: usize) -> Vec<Message> {
    let mut parts = Vec::new();
    let mut splits = 0;
    let _ = send_in_parts(
        sender,
        message,
        &mut |env: &Envelope| {
            if items(&env.message) > 1 && env.encode().len() > max_frame {
                return Err(());
            }
            parts.push(env.message.clone());
            Ok(())
        },
        &|_: &()| true,
        &mut splits,
    );
    parts
}

/// The items a coalesced message carries (1 for any other message).
pub fn items(m: &Message) -> usize {
    match m {
        Message::Acks(acks) => acks.len(),
        Message::StatusQuery(ids) => ids.len(),
        Message::StatusReply(r) => r.known.len() + r.unknown.len(),
        _ => 1,
    }
}
