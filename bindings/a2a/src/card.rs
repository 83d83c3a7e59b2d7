//! The A2A AgentCard subset we publish and read, and the Abhyasa extension
//! entry in `capabilities.extensions[]` (C-A2A-1).
//!
//! Field names follow A2A 1.0's JSON (camelCase, proto3 JSON mapping). The
//! extension `params` are the public v1 `AbhyasaServiceRef`, whose JSON
//! Schema is derived from [`ServiceRefJson`] and checked against the
//! published v1 manifest by a test.

use abhyasa_core::{json::parse_object, FieldError, FieldProblem, KindProfile, ProfileError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The v1 extension URI: the key of our entry in `capabilities.extensions[]`,
/// of the obligation in `message.metadata`, and the value activated by the
/// `A2A-Extensions` header.
pub const EXTENSION_URI: &str = "https://ravikiran438.github.io/abhyasa-protocol/v1";

/// The Abhyasa protocol version we implement (the v1 manifest's semver).
pub const ABHYASA_VERSION: &str = "1.0.0";

/// The A2A protocol version this binding speaks.
pub const A2A_VERSION: &str = "1.0";

/// Name of the bearer security scheme we declare in the card.
pub const BEARER_SCHEME: &str = "abhyasa_bearer";

/// An A2A 1.0 AgentCard (the fields we publish; unknown fields of a card
/// we read are ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// Human-readable agent name.
    pub name: String,
    /// What the agent does.
    pub description: String,
    /// Where and how the agent is reached, preferred first.
    pub supported_interfaces: Vec<AgentInterface>,
    /// The agent's own version.
    pub version: String,
    /// Optional capabilities, including extensions.
    pub capabilities: AgentCapabilities,
    /// Security schemes by name (bearer credentials per peer, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub security_schemes: BTreeMap<String, SecurityScheme>,
    /// Which schemes a request must satisfy (any one entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_requirements: Vec<SecurityRequirement>,
    /// Media types accepted as input.
    pub default_input_modes: Vec<String>,
    /// Media types produced as output.
    pub default_output_modes: Vec<String>,
    /// What the agent can be asked to do.
    pub skills: Vec<AgentSkill>,
}

/// One `supportedInterfaces[]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    /// The endpoint URL.
    pub url: String,
    /// `JSONRPC`, `HTTP+JSON` or `GRPC`.
    pub protocol_binding: String,
    /// A2A version spoken there, e.g. `1.0`.
    pub protocol_version: String,
}

/// `capabilities`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// Server-sent streaming support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<bool>,
    /// Push notification support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_notifications: Option<bool>,
    /// Protocol extensions the agent supports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<AgentExtension>,
}

/// One `capabilities.extensions[]` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentExtension {
    /// The extension's URI.
    pub uri: String,
    /// How the agent uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether a client must activate it.
    #[serde(default)]
    pub required: bool,
    /// Extension-specific parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// A skill.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// Unique id.
    pub id: String,
    /// Name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Keywords.
    pub tags: Vec<String>,
}

/// A security scheme (the one-of as A2A 1.0 JSON spells it; only HTTP
/// auth and mutual TLS are produced here).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SecurityScheme {
    /// HTTP authentication (RFC 7235), e.g. `Bearer`.
    HttpAuthSecurityScheme(HttpAuthSecurityScheme),
    /// Mutual TLS.
    MtlsSecurityScheme(MtlsSecurityScheme),
}

/// `httpAuthSecurityScheme`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpAuthSecurityScheme {
    /// What the credential is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The HTTP auth scheme, e.g. `Bearer`.
    pub scheme: String,
    /// Hint about the bearer token's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_format: Option<String>,
}

/// `mtlsSecurityScheme`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MtlsSecurityScheme {
    /// What certificates are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One `securityRequirements[]` entry: scheme names to required scopes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityRequirement {
    /// Scheme name to scope list.
    pub schemes: BTreeMap<String, StringList>,
}

/// A2A's `StringList` wrapper.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringList {
    /// The strings.
    #[serde(default)]
    pub list: Vec<String>,
}

impl SecurityRequirement {
    /// The requirement "a per-peer bearer credential" ([`BEARER_SCHEME`]).
    pub fn bearer() -> Self {
        let mut schemes = BTreeMap::new();
        schemes.insert(BEARER_SCHEME.to_string(), StringList::default());
        Self { schemes }
    }
}

/// The v1 `AbhyasaServiceRef`: the custody layer an agent advertises, with
/// every kind profile validated (AB-2 sizing rule).
#[derive(Clone, Debug, PartialEq)]
pub struct AbhyasaServiceRef {
    /// Abhyasa protocol semver implemented.
    pub version: String,
    /// Where this agent, as custodian, receives asynchronous acks.
    pub custody_ack_endpoint: String,
    /// One profile per kind carried under custody; never empty.
    pub supported_kinds: Vec<KindProfile>,
}

/// Why extension params were not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceRefError {
    /// A field of the service ref is missing or of the wrong type.
    #[error("{0}")]
    Field(#[from] FieldError),
    /// A kind profile is invalid (including the AB-2 sizing rule); the
    /// index says which.
    #[error("supported_kinds[{index}]: {error}")]
    Profile {
        /// Index in `supported_kinds`.
        index: usize,
        /// What was wrong.
        error: ProfileError,
    },
    /// The JSON document did not parse.
    #[error("{0}")]
    Json(String),
}

impl ServiceRefError {
    /// The dotted path of the offending field, for JSON error bodies.
    pub fn field(&self) -> String {
        match self {
            Self::Field(f) => f.field.clone(),
            Self::Profile { index, error } => match error {
                ProfileError::Field(f) => format!("supported_kinds[{index}].{}", f.field),
                _ => format!("supported_kinds[{index}].max_retries"),
            },
            Self::Json(_) => "(document)".into(),
        }
    }
}

impl AbhyasaServiceRef {
    /// A service ref; every profile is validated (AB-2 sizing rule) and at
    /// least one is required, as the v1 schema says (`minItems: 1`).
    pub fn new(
        custody_ack_endpoint: impl Into<String>,
        supported_kinds: Vec<KindProfile>,
    ) -> Result<Self, ServiceRefError> {
        let r = Self {
            version: ABHYASA_VERSION.into(),
            custody_ack_endpoint: custody_ack_endpoint.into(),
            supported_kinds,
        };
        r.validate()?;
        Ok(r)
    }

    /// Checks the schema's constraints and each profile's `validate`.
    pub fn validate(&self) -> Result<(), ServiceRefError> {
        if self.supported_kinds.is_empty() {
            return Err(FieldError::new(
                "supported_kinds",
                FieldProblem::OutOfRange {
                    allowed: "at least one kind profile".into(),
                },
            )
            .into());
        }
        for (index, p) in self.supported_kinds.iter().enumerate() {
            p.validate()
                .map_err(|error| ServiceRefError::Profile { index, error })?;
        }
        Ok(())
    }

    /// Parses v1 params strictly (integers must be integers, profiles
    /// must be coherent); unknown extra fields are ignored (C-T-3).
    pub fn from_json_value(v: &Value) -> Result<Self, ServiceRefError> {
        let Value::Object(m) = v else {
            return Err(FieldError::wrong_type("params", "object", json_type(v)).into());
        };
        let s = |name: &str| -> Result<String, FieldError> {
            match m.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                None | Some(Value::Null) => Err(FieldError::missing(name)),
                Some(other) => Err(FieldError::wrong_type(name, "string", json_type(other))),
            }
        };
        let version = s("version")?;
        let custody_ack_endpoint = s("custody_ack_endpoint")?;
        let kinds = match m.get("supported_kinds") {
            Some(Value::Array(a)) => a,
            None | Some(Value::Null) => return Err(FieldError::missing("supported_kinds").into()),
            Some(other) => {
                return Err(
                    FieldError::wrong_type("supported_kinds", "array", json_type(other)).into(),
                )
            }
        };
        let mut supported_kinds = Vec::with_capacity(kinds.len());
        for (index, k) in kinds.iter().enumerate() {
            let Value::Object(km) = k else {
                return Err(FieldError::wrong_type(
                    format!("supported_kinds[{index}]"),
                    "object",
                    json_type(k),
                )
                .into());
            };
            let p = KindProfile::from_json_map(km)
                .map_err(|error| ServiceRefError::Profile { index, error })?;
            supported_kinds.push(p);
        }
        let r = Self {
            version,
            custody_ack_endpoint,
            supported_kinds,
        };
        r.validate()?;
        Ok(r)
    }

    /// Parses v1 params from JSON text (size-limited).
    pub fn from_json(text: &[u8]) -> Result<Self, ServiceRefError> {
        let m = parse_object(text).map_err(|e| ServiceRefError::Json(e.to_string()))?;
        Self::from_json_value(&Value::Object(m))
    }

    /// The v1 JSON of the params, through the schema-bearing types.
    pub fn to_json_value(&self) -> Value {
        serde_json::to_value(ServiceRefJson::from(self)).unwrap_or(Value::Null)
    }

    /// Our `capabilities.extensions[]` entry (never `required`: an agent
    /// that does not speak Abhyasa may still talk to us).
    pub fn to_extension(&self, description: impl Into<String>) -> AgentExtension {
        AgentExtension {
            uri: EXTENSION_URI.into(),
            description: Some(description.into()),
            required: false,
            params: Some(self.to_json_value()),
        }
    }

    /// Finds and parses our entry in a card's extensions: `Ok(None)` when
    /// absent; entries with other URIs are skipped; a present entry with
    /// bad params is an error (a card that says it speaks Abhyasa but
    /// cannot be honored must not be silently treated as "no custody").
    pub fn from_extensions(ext: &[AgentExtension]) -> Result<Option<Self>, ServiceRefError> {
        match ext.iter().find(|e| e.uri == EXTENSION_URI) {
            None => Ok(None),
            Some(e) => match &e.params {
                None => Err(FieldError::missing("params").into()),
                Some(p) => Self::from_json_value(p).map(Some),
            },
        }
    }

    /// [`from_extensions`](Self::from_extensions) over a card.
    pub fn from_card(card: &AgentCard) -> Result<Option<Self>, ServiceRefError> {
        Self::from_extensions(&card.capabilities.extensions)
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn default_backoff() -> String {
    "exponential".into()
}

fn default_base() -> f64 {
    1.0
}

/// The v1 `AbhyasaServiceRef` as a serde/schemars type: the one place the
/// params' JSON shape and its JSON Schema come from. Titles, descriptions
/// and constraints are the published v1 schema's (`spec/manifest.json`).
#[derive(Serialize, JsonSchema)]
#[schemars(
    title = "AbhyasaServiceRef",
    description = "Abhyasa-specific fields contributed to an A2A AgentCard.\n\nValidators detect Abhyasa support by the presence of an entry in\n``capabilities.extensions[]`` whose ``uri`` equals ``ABHYASA_EXTENSION_URI``.\nThe body of that entry SHOULD deserialize to this model. The custody layer is\nadvertised once per agent: the agent-level ``custody_ack_endpoint`` plus one\n:class:`KindProfile` per governance kind carried under custody. Domain\nprotocols (Phala, Anumati, OAuth, ...) carry no custody fields of their own."
)]
pub struct ServiceRefJson {
    /// Protocol semver.
    #[schemars(
        title = "Version",
        description = "Abhyasa protocol semver this agent implements (e.g. '1.0.0')."
    )]
    pub version: String,
    /// Async ack endpoint.
    #[schemars(
        title = "Custody Ack Endpoint",
        description = "Agent-level HTTPS URL where this agent (as custodian) receives asynchronous CustodyAcks for the deferred discharge path."
    )]
    pub custody_ack_endpoint: String,
    /// Kind profiles.
    #[schemars(
        title = "Supported Kinds",
        description = "Per-kind custody delivery profiles; one entry per governance kind this agent carries under custody.",
        extend("minItems" = 1)
    )]
    pub supported_kinds: Vec<KindProfileJson>,
}

/// The v1 `KindProfile` as a serde/schemars type (see [`ServiceRefJson`]).
#[derive(Serialize, JsonSchema)]
#[schemars(
    rename = "KindProfile",
    title = "KindProfile",
    description = "Per-kind custody delivery profile inside an :class:`AbhyasaServiceRef`.\n\nCustody is a cross-cutting concern, so the delivery profile is declared once\nper governance *kind* an agent carries under custody — not duplicated into\neach domain protocol's own AgentCard block. Each kind tunes its own\ndeadline (e.g. a Phala corrective update at 24 h, an Anumati consent at 1 h)."
)]
pub struct KindProfileJson {
    /// Kind.
    #[schemars(
        title = "Kind",
        description = "Obligation kind, e.g. 'phala.belief_update'.",
        length(min = 1)
    )]
    pub kind: String,
    /// Endpoint.
    #[schemars(
        title = "Obligation Endpoint",
        description = "HTTPS URL where obligations of this kind are POSTed under custody."
    )]
    pub obligation_endpoint: String,
    /// Deadline.
    #[schemars(
        title = "Deadline Seconds",
        description = "AB-1 custody deadline for this kind.",
        transform = positive_integer
    )]
    pub deadline_seconds: u64,
    /// Retry bound.
    #[schemars(
        title = "Max Retries",
        description = "AB-2 retransmission bound; MUST be large enough that the capped exponential backoff spans deadline_seconds (the deadline, not the retry count, is the binding terminator)."
    )]
    pub max_retries: u64,
    /// Strategy.
    #[serde(default = "default_backoff")]
    #[schemars(
        title = "Backoff",
        description = "Retry backoff strategy. Only 'exponential' is defined in v1."
    )]
    pub backoff: String,
    /// Base interval.
    #[serde(default = "default_base")]
    #[schemars(
        title = "Backoff Base Seconds",
        description = "Initial backoff interval.",
        extend("exclusiveMinimum" = 0)
    )]
    pub backoff_base_seconds: f64,
    /// Cap.
    #[schemars(
        title = "Backoff Cap Seconds",
        description = "Backoff cap; kept below the deadline so several attempts fall within it.",
        transform = positive_integer
    )]
    pub backoff_cap_seconds: u64,
}

/// `u64` derives `minimum: 0`; the v1 schema says `exclusiveMinimum: 0`
/// (a zero deadline or cap is meaningless), which is also what
/// `KindProfile::validate` enforces.
fn positive_integer(s: &mut schemars::Schema) {
    s.remove("minimum");
    s.insert("exclusiveMinimum".into(), Value::from(0));
}

impl From<&AbhyasaServiceRef> for ServiceRefJson {
    fn from(r: &AbhyasaServiceRef) -> Self {
        Self {
            version: r.version.clone(),
            custody_ack_endpoint: r.custody_ack_endpoint.clone(),
            supported_kinds: r
                .supported_kinds
                .iter()
                .map(|p| KindProfileJson {
                    kind: p.kind.as_str().to_string(),
                    obligation_endpoint: p.obligation_endpoint.clone(),
                    deadline_seconds: p.deadline_seconds,
                    max_retries: p.max_retries,
                    backoff: p.backoff.clone(),
                    backoff_base_seconds: p.backoff_base_seconds,
                    backoff_cap_seconds: p.backoff_cap_seconds,
                })
                .collect(),
        }
    }
}

/// The JSON Schema of the extension params, derived from the live types.
///
/// Two generator-level adjustments, both annotation-only: no `$schema`
/// key (the v1 schema is embedded in a manifest, not a standalone
/// document), and no `format` keywords (`uint64`, `double` are schemars
/// annotations that validators ignore and the v1 schema does not carry).
pub fn params_schema() -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.meta_schema = None)
        .with_transform(schemars::transform::RecursiveTransform(
            |s: &mut schemars::Schema| {
                s.remove("format");
            },
        ));
    let schema = settings
        .into_generator()
        .into_root_schema_for::<ServiceRefJson>();
    schema.to_value()
}

/// A minimal card for an agent serving the HTTP binding at `base_url`
/// (no trailing slash), advertising `service` and bearer authentication.
pub fn agent_card(name: &str, base_url: &str, service: &AbhyasaServiceRef) -> AgentCard {
    let mut security_schemes = BTreeMap::new();
    security_schemes.insert(
        BEARER_SCHEME.to_string(),
        SecurityScheme::HttpAuthSecurityScheme(HttpAuthSecurityScheme {
            description: Some(
                "Per-peer bearer credential: each token is bound to one agent id, the \
                 custodian AB-3 keys idempotency on"
                    .into(),
            ),
            scheme: "Bearer".into(),
            bearer_format: Some("opaque".into()),
        }),
    );
    AgentCard {
        name: name.into(),
        description: format!(
            "Abhyasa node {name}: receives governance obligations under custody \
             (deliver-or-report)"
        ),
        supported_interfaces: vec![
            AgentInterface {
                url: base_url.into(),
                protocol_binding: "JSONRPC".into(),
                protocol_version: A2A_VERSION.into(),
            },
            AgentInterface {
                url: base_url.into(),
                protocol_binding: "HTTP+JSON".into(),
                protocol_version: A2A_VERSION.into(),
            },
        ],
        version: env!("CARGO_PKG_VERSION").into(),
        capabilities: AgentCapabilities {
            streaming: Some(false),
            push_notifications: Some(false),
            extensions: vec![service.to_extension(format!(
                "Abhyasa custody (deliver-or-report) for governance obligations; agent {name}"
            ))],
        },
        security_schemes,
        security_requirements: vec![SecurityRequirement::bearer()],
        default_input_modes: vec!["application/json".into()],
        default_output_modes: vec!["application/json".into()],
        skills: vec![AgentSkill {
            id: "abhyasa.custody".into(),
            name: "Governance obligation custody".into(),
            description: "Applies, declines or defers governance obligations (consent \
                          revocations, welfare signals, token revocations) with custody acks"
                .into(),
            tags: vec!["abhyasa".into(), "governance".into(), "custody".into()],
        }],
    }
}

/// The advertised profile of `kind` for a custodian retrying with
/// `backoff` up to `deadline_seconds`.
///
/// v1 advertises the cap in whole seconds, so a cap like 1.5 s is
/// advertised rounded down (at least 1 s), and `max_retries` is sized for
/// both the advertised and the actual cap, whichever needs more (a smaller
/// cap needs more retries to span the deadline): the advertised profile
/// passes its own AB-2 check and still describes enough retries for the
/// real schedule. One retry of margin is added, as before.
pub fn kind_profile(
    kind: abhyasa_core::Kind,
    obligation_endpoint: impl Into<String>,
    deadline_seconds: u64,
    backoff: &abhyasa_core::RetryBackoff,
) -> Result<KindProfile, ProfileError> {
    let base = backoff.base.as_secs_f64();
    let advertised_cap = backoff.cap.as_secs().max(1);
    let needed =
        abhyasa_core::min_retries_to_span(deadline_seconds, base, advertised_cap as f64).max(
            abhyasa_core::min_retries_to_span(deadline_seconds, base, backoff.cap.as_secs_f64()),
        );
    let p = KindProfile {
        kind,
        obligation_endpoint: obligation_endpoint.into(),
        deadline_seconds,
        max_retries: needed.saturating_add(1),
        backoff: "exponential".into(),
        backoff_base_seconds: base,
        backoff_cap_seconds: advertised_cap,
    };
    p.validate()?;
    Ok(p)
}
