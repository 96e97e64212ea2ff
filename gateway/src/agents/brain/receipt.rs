//! Receipts: what Brain is answered for each operation (`accepted`, `progress`, `result`,
//! `returned`, `failure`, `unknown`), and the failure codes Plinth uses.

use plinth_kit::{ErrorCode, PlinthError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One receipt, as sent and as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Receipt {
    /// The operation is accepted; setup names the method Brain calls when a turn ends.
    Accepted {
        /// `release` when a turn-end release is registered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        on_turn_end: Option<String>,
    },
    /// The operation is still running (a delivery met it in flight); its outcome is not
    /// known yet.
    Progress {
        /// What is happening.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The operation finished with output.
    Result {
        /// Its output.
        output: Value,
    },
    /// The operation finished; it may say something.
    Returned {
        /// What it says, if anything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
    },
    /// The operation failed.
    Failure(Failure),
    /// The operation may have had its effect, and no reliable result exists.
    Unknown {
        /// Why it is unknown.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
}

/// A failure receipt's fields (they reach a Tool's result unchanged).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// What kind of failure (see [`codes`]).
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Whether the same operation might succeed later (advisory).
    pub retryable: bool,
    /// Particulars: the resource at fault, the cleanup evidence, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// The failure codes Plinth answers, besides Plinth's own error codes (`environment_invalid`,
/// `environment_not_ready`, `file_too_large`, …), which tool and setup failures carry as they
/// are.
pub mod codes {
    /// Another contract, an operation, descriptor, tool or call Plinth does not serve.
    pub const UNSUPPORTED: &str = "unsupported";
    /// The operation's request is malformed; the message names the field.
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// A Tool's deadline expired.
    pub const TIMEOUT: &str = "timeout";
    /// A Tool was cancelled explicitly.
    pub const CANCELLED: &str = "cancelled";
    /// The session's resources are gone (its node, its working directory, or its Plinth
    /// session was ended elsewhere); they are not replaced.
    pub const RESOURCE_LOST: &str = "resource_lost";
    /// The Environment is not set up in this session, or was detached or torn down.
    pub const NOT_ATTACHED: &str = "not_attached";
    /// The sequence was delivered before with a different request.
    pub const SEQUENCE_REUSED: &str = "sequence_reused";
    /// An execution's callback URL is not at one of the adapter's registered callback
    /// origins; nothing ran and nothing was sent to it.
    pub const CALLBACK_REFUSED: &str = "callback_refused";
}

impl Receipt {
    /// A failure receipt.
    pub fn failure(code: &str, message: impl Into<String>, retryable: bool) -> Receipt {
        Receipt::Failure(Failure {
            code: code.to_owned(),
            message: message.into(),
            retryable,
            details: None,
        })
    }

    /// `unsupported`.
    pub fn unsupported(message: impl Into<String>) -> Receipt {
        Receipt::failure(codes::UNSUPPORTED, message, false)
    }

    /// `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Receipt {
        Receipt::failure(codes::INVALID_REQUEST, message, false)
    }

    /// The receipt as stored and sent.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"type":"failure","code":"internal","message":"the receipt could not be encoded","retryable":false}"#.to_owned()
        })
    }
}

impl From<Failure> for Receipt {
    fn from(failure: Failure) -> Receipt {
        Receipt::Failure(failure)
    }
}

/// A Plinth error as a failure receipt: its code as it is, retryable when the service
/// behind was unavailable.
pub fn from_error(error: &PlinthError) -> Failure {
    Failure {
        code: error.code.as_str().to_owned(),
        message: error.message.clone(),
        retryable: error.code == ErrorCode::Unavailable,
        details: error.detail.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_have_the_protocols_shapes() {
        let cases = [
            (
                Receipt::Accepted {
                    on_turn_end: Some("release".into()),
                },
                r#"{"type":"accepted","on_turn_end":"release"}"#,
            ),
            (
                Receipt::Accepted { on_turn_end: None },
                r#"{"type":"accepted"}"#,
            ),
            (
                Receipt::Progress { message: None },
                r#"{"type":"progress"}"#,
            ),
            (
                Receipt::Result {
                    output: serde_json::json!({"a": 1}),
                },
                r#"{"type":"result","output":{"a":1}}"#,
            ),
            (Receipt::Returned { output: None }, r#"{"type":"returned"}"#),
            (
                Receipt::unsupported("no"),
                r#"{"type":"failure","code":"unsupported","message":"no","retryable":false}"#,
            ),
            (Receipt::Unknown { message: None }, r#"{"type":"unknown"}"#),
        ];
        for (receipt, text) in cases {
            assert_eq!(receipt.to_json(), text);
            assert_eq!(
                serde_json::from_str::<Receipt>(text).expect("parse"),
                receipt
            );
        }
    }
}
