//! OAuth token lifecycle: revocation is admissible and fail-closed;
//! issue/refresh are best-effort.

use super::{key, payload_str, Admission, Classification, PolarityRule};
use crate::error::{FieldError, FieldProblem};
use crate::model::{Obligation, SafeAction, SafeEffect};
use crate::principal::Authorization;

/// The rationale of this rule's fail-safe (recorded with an escalation).
pub const OAUTH_RATIONALE: &str = "OAuth: an unconfirmed token revocation defaults fail-closed: \
                                    stop honoring the token";

/// `oauth.token`.
pub const OAUTH_KIND: &str = "oauth.token";

/// The OAuth rule. Payload: `action` (`revoke` | `issue` | `refresh`,
/// required) and `token_id` or else `client_id` (one required). The key is
/// `token:<id>` or `client:<id>`: a token and a client never share a key,
/// and there is no fallback to the target.
#[derive(Debug, Clone, Copy, Default)]
pub struct OAuthRule;

impl PolarityRule for OAuthRule {
    fn kind(&self) -> &str {
        OAUTH_KIND
    }

    fn classify(&self, ob: &Obligation) -> Result<Classification, FieldError> {
        let revoke = match payload_str(ob, "action")? {
            Some("revoke") => true,
            Some("issue") | Some("refresh") => false,
            Some(other) => {
                return Err(FieldError::new(
                    "payload.action",
                    FieldProblem::UnknownValue {
                        value: other.to_string(),
                        expected: "revoke | issue | refresh",
                    },
                ))
            }
            None => return Err(FieldError::missing("payload.action")),
        };
        let name = match (payload_str(ob, "token_id")?, payload_str(ob, "client_id")?) {
            (Some(t), _) => ["token:", t],
            (None, Some(c)) => ["client:", c],
            (None, None) => return Err(FieldError::invalid(
                "payload.token_id",
                "required (or payload.client_id): the governed key must name the token or client",
            )),
        };
        let key = key(OAUTH_KIND, ob.target(), &name)?;
        Ok(if revoke {
            Classification {
                admission: Admission::Custody {
                    safe: SafeAction {
                        obligation_id: ob.id().clone(),
                        target: ob.target().clone(),
                        effect: SafeEffect::FailClosed,
                        key: key.clone(),
                        sequence: ob.sequence(),
                        rationale: std::borrow::Cow::Borrowed(OAUTH_RATIONALE),
                    },
                },
                key: Some(key),
                guarded: true,
                at_offer: None,
            }
        } else {
            Classification {
                admission: Admission::BestEffort,
                key: Some(key),
                guarded: true,
                at_offer: Some(Authorization::Granted),
            }
        })
    }
}
