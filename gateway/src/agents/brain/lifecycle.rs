//! A binding's life: `setup` allocates its Plinth session (the version pinned for the
//! binding's whole life), `call release` at a turn's end ends a disposable session's
//! resources or keeps a workspace's, `detach` releases the binding, `teardown` ends every
//! session it ever had. Resources that are lost are reported, never silently replaced: only
//! a release (asked for) lets the next tool call allocate anew.

use std::time::Duration;

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde_json::{Value, json};

use super::Context;
use super::receipt::{self, Failure, Receipt, codes};
use crate::runtime::live;

/// Sessions asked for in one page of an owner's sessions: the catalog's most.
const OWNED_PAGE: u32 = 1000;

/// What an Environment's configuration may ask of Plinth; every other key is kept unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Configuration {
    /// A ready version to pin instead of the active one.
    pub version: Option<u32>,
    /// `disposable` (a turn-end release ends the session's resources) or `workspace` (they
    /// last until teardown). Default: `workspace`.
    pub lifetime: Lifetime,
    /// Whether setup registers a turn-end release. Default: true.
    pub release_on_turn_end: bool,
}

/// What a binding's resources last as: the contract's enum, whose labels (`disposable`,
/// `workspace`, as the configuration says them) are defined once, in `plinth_proto`.
pub use pb::BindingLifetime as Lifetime;

impl Configuration {
    /// Reads the keys Plinth understands; a key Plinth understands with a wrong value is
    /// refused, anything else is left for whoever reads it.
    pub fn parse(configuration: Option<&Value>) -> Result<Configuration, Receipt> {
        let mut parsed = Configuration {
            version: None,
            lifetime: Lifetime::Workspace,
            release_on_turn_end: true,
        };
        let Some(configuration) = configuration.filter(|value| !value.is_null()) else {
            return Ok(parsed);
        };
        let Some(map) = configuration.as_object() else {
            return Err(Receipt::invalid(
                "operation.configuration: expected an object",
            ));
        };
        if let Some(version) = map.get("version").filter(|value| !value.is_null()) {
            let version = version
                .as_u64()
                .and_then(|version| u32::try_from(version).ok())
                .filter(|version| *version > 0)
                .ok_or_else(|| {
                    Receipt::invalid("operation.configuration.version: a version number")
                })?;
            parsed.version = Some(version);
        }
        if let Some(lifetime) = map.get("lifetime").filter(|value| !value.is_null()) {
            parsed.lifetime = lifetime
                .as_str()
                .and_then(Lifetime::from_label)
                .ok_or_else(|| {
                    Receipt::invalid(
                        "operation.configuration.lifetime: \"disposable\" or \"workspace\"",
                    )
                })?;
        }
        if let Some(release) = map
            .get("release_on_turn_end")
            .filter(|value| !value.is_null())
        {
            parsed.release_on_turn_end = release.as_bool().ok_or_else(|| {
                Receipt::invalid("operation.configuration.release_on_turn_end: true or false")
            })?;
        }
        Ok(parsed)
    }
}

/// The label of the sessions made for a binding.
pub fn owner(key: &pb::BindingKey) -> String {
    format!(
        "brain:{}:{}:{}",
        key.adapter_id, key.session_id, key.environment
    )
}

/// The binding, or `None` when it was never set up.
pub async fn binding(context: &Context) -> Result<Option<pb::Binding>, Receipt> {
    let found = context
        .state
        .brain()
        .get_binding(pb::GetBindingRequest {
            adapter_id: context.binding.adapter_id.clone(),
            session_id: context.binding.session_id.clone(),
            environment: context.binding.environment.clone(),
        })
        .await;
    match found {
        Ok(binding) => Ok(Some(binding.into_inner())),
        Err(status) => {
            let error = PlinthError::from_status(&status);
            if error.code == ErrorCode::NotFound {
                Ok(None)
            } else {
                Err(receipt::from_error(&error).into())
            }
        }
    }
}

/// The lifetime in force: the operation's current configuration when it says, else the
/// binding's from setup.
fn lifetime(context: &Context, binding: &pb::Binding) -> Lifetime {
    let said = context
        .configuration
        .as_ref()
        .and_then(|configuration| configuration.get("lifetime"))
        .and_then(Value::as_str)
        .and_then(Lifetime::from_label);
    match (said, binding.lifetime()) {
        (Some(said), _) => said,
        (None, Lifetime::Unspecified) => Lifetime::Workspace,
        (None, stored) => stored,
    }
}

fn accepted(binding: &pb::Binding) -> Receipt {
    Receipt::Accepted {
        on_turn_end: binding.release_on_turn_end.then(|| "release".to_owned()),
    }
}

/// Makes a Plinth session for the binding, on `version` (the active one when `None`), and
/// attaches it on its node.
pub async fn allocate(context: &Context, version: Option<u32>) -> Result<pb::Session, Failure> {
    let session = context
        .state
        .sessions()
        .create_session(pb::CreateSessionRequest {
            scope: context.scope().to_owned(),
            environment_id: context.adapter.environment_id.clone(),
            harness_id: String::new(),
            version,
            owner: owner(&context.binding),
            limits: Some(context.state.runtime.session_limits.defaults().to_catalog()),
            exclude_node: String::new(),
        })
        .await
        .map_err(|status| receipt::from_error(&PlinthError::from_status(&status)))?
        .into_inner();
    live::start_session(&context.state.runtime, context.scope(), session)
        .await
        .map_err(|error| receipt::from_error(&error.0))
}

/// Ends a Plinth session: its commands stop and its working directory is removed. A node
/// that does not answer drops it when it comes back (it drops what the catalog ended).
/// Answers what happened, as evidence.
pub async fn end(context: &Context, id: &str) -> Value {
    let session = context
        .state
        .sessions()
        .get_session(pb::GetSessionRequest {
            scope: context.scope().to_owned(),
            id: id.to_owned(),
        })
        .await;
    let session = match session {
        Ok(session) => session.into_inner(),
        Err(status) => return json!({ "session": id, "error": status.message() }),
    };
    // The node is named by its id: its address is internal, and the answer goes to Brain.
    let mut evidence = json!({ "session": id, "node": session.node_id });
    let detached = match context.state.runtime.nodes.client(&session.node_address) {
        Ok(mut client) => client
            .detach(node::DetachRequest {
                session_id: id.to_owned(),
            })
            .await
            .map(|_| ())
            .map_err(|status| PlinthError::from_status(&status).message),
        Err(error) => Err(error.0.message),
    };
    match detached {
        Ok(()) => evidence["workdir_removed"] = json!(true),
        Err(message) => {
            // The node's error may name internal addresses: it goes to the log, and the
            // answer says only what happened.
            tracing::warn!(session = %id, node = %session.node_id, error = %message, "a brain binding's session could not be detached from its node");
            evidence["workdir_removed"] = json!(false);
            evidence["node_error"] = json!(
                "the node did not detach the session; it removes the working directory when it next hears the session ended"
            );
        }
    }
    let ended = context
        .state
        .sessions()
        .end_session(pb::EndSessionRequest {
            scope: context.scope().to_owned(),
            id: id.to_owned(),
        })
        .await;
    evidence["ended"] = json!(ended.is_ok());
    tracing::info!(session = %id, brain_session = %context.binding.session_id, "brain binding's session ended");
    evidence
}

/// `setup`: allocates the binding's session and registers the turn-end release.
pub async fn setup(context: &Context) -> Receipt {
    let configuration = match Configuration::parse(context.configuration.as_ref()) {
        Ok(configuration) => configuration,
        Err(receipt) => return receipt,
    };
    match binding(context).await {
        Err(receipt) => return receipt,
        Ok(Some(existing)) => return resume(context, existing).await,
        Ok(None) => {}
    }
    let session = match allocate(context, configuration.version).await {
        Ok(session) => session,
        Err(failure) => return failure.into(),
    };
    let created = context
        .state
        .brain()
        .create_binding(pb::CreateBindingRequest {
            binding: Some(pb::Binding {
                key: Some(context.binding.clone()),
                scope: context.scope().to_owned(),
                environment_id: context.adapter.environment_id.clone(),
                version: session.version,
                lifetime: configuration.lifetime.into(),
                release_on_turn_end: configuration.release_on_turn_end,
                plinth_session_id: session.id.clone(),
                configuration_json: context
                    .configuration
                    .as_ref()
                    .map_or_else(|| "{}".to_owned(), Value::to_string),
                ..Default::default()
            }),
        })
        .await;
    let created = match created {
        Ok(created) => created.into_inner(),
        Err(status) => {
            end(context, &session.id).await;
            return receipt::from_error(&PlinthError::from_status(&status)).into();
        }
    };
    let binding = created.binding.unwrap_or_default();
    if !created.created {
        // Another setup of this binding got there first: its session stands.
        end(context, &session.id).await;
        return resume(context, binding).await;
    }
    accepted(&binding)
}

/// Setup of a binding that exists: a detached one is attached again with what it kept (an
/// attached one stays as it is); the catalog refuses a torn-down one.
async fn resume(context: &Context, _existing: pb::Binding) -> Receipt {
    match set_state(context, pb::BindingState::Attached).await {
        Ok(binding) => accepted(&binding),
        Err(Refused::Binding(pb::BindingState::TornDown)) => Receipt::failure(
            codes::NOT_ATTACHED,
            format!(
                "Environment {:?} of this session was torn down; it cannot be set up again",
                context.binding.environment
            ),
            false,
        ),
        Err(refused) => refused.into(),
    }
}

/// Why the catalog did not move a binding.
pub(super) enum Refused {
    /// Its life does not allow the move: it is in this state.
    Binding(pb::BindingState),
    /// Anything else, as its receipt.
    Other(Receipt),
}

impl From<Refused> for Receipt {
    fn from(refused: Refused) -> Receipt {
        match refused {
            Refused::Binding(state) => Receipt::failure(
                codes::NOT_ATTACHED,
                format!("the binding is {}", state.label()),
                false,
            ),
            Refused::Other(receipt) => receipt,
        }
    }
}

/// A catalog refusal as [`Refused`]: a binding-state refusal names its state in
/// `detail.binding_state`.
pub(super) fn refused(status: &tonic::Status) -> Refused {
    let error = PlinthError::from_status(status);
    let state = error
        .detail
        .as_ref()
        .and_then(|detail| detail.get("binding_state"))
        .and_then(Value::as_str)
        .and_then(pb::BindingState::from_label);
    match (error.code, state) {
        (ErrorCode::PreconditionFailed, Some(state)) => Refused::Binding(state),
        _ => Refused::Other(receipt::from_error(&error).into()),
    }
}

/// Moves the binding; the catalog checks its life allows it.
async fn set_state(context: &Context, state: pb::BindingState) -> Result<pb::Binding, Refused> {
    context
        .state
        .brain()
        .set_binding_state(pb::SetBindingStateRequest {
            key: Some(context.binding.clone()),
            state: state.into(),
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| refused(&status))
}

/// Takes the binding's session away from it (compare-and-set); answers the session taken,
/// or `None` when it had none (or another operation took it first).
async fn take_session(context: &Context, binding: &pb::Binding) -> Result<Option<String>, Receipt> {
    if binding.plinth_session_id.is_empty() {
        return Ok(None);
    }
    let swapped = context
        .state
        .brain()
        .swap_binding_session(pb::SwapBindingSessionRequest {
            key: Some(context.binding.clone()),
            expected: binding.plinth_session_id.clone(),
            replacement: String::new(),
        })
        .await
        .map_err(|status| Receipt::from(receipt::from_error(&PlinthError::from_status(&status))))?
        .into_inner();
    Ok(swapped.swapped.then(|| binding.plinth_session_id.clone()))
}

/// `call {name, input}`: only `release` is served.
pub async fn call(context: &Context, request: &serde_json::Map<String, Value>) -> Receipt {
    let name = request.get("name").and_then(Value::as_str).unwrap_or("");
    if name != "release" {
        return Receipt::unsupported(format!(
            "call {name:?} is not served here; the only method is \"release\""
        ));
    }
    let turn = request
        .get("input")
        .and_then(|input| input.get("sequence"))
        .and_then(Value::as_u64);
    let Some(turn) = turn else {
        return Receipt::invalid(
            "operation.request.input.sequence: the sequence of the turn that ended",
        );
    };
    let binding = match binding(context).await {
        Ok(Some(binding)) => binding,
        Ok(None) => return not_set_up(context),
        Err(receipt) => return receipt,
    };
    let lifetime = lifetime(context, &binding);
    let mut output = json!({ "turn": turn, "lifetime": lifetime.label(), "released": false });
    if binding.state() != pb::BindingState::Attached {
        output["reason"] = json!(format!("the binding is {}", binding.state().label()));
        return Receipt::Returned {
            output: Some(output),
        };
    }
    if !binding.release_on_turn_end {
        output["reason"] =
            json!("turn-end release is not enabled in this Environment's configuration");
        return Receipt::Returned {
            output: Some(output),
        };
    }
    if lifetime == Lifetime::Workspace {
        if !binding.plinth_session_id.is_empty() {
            output["kept"] = json!(binding.plinth_session_id);
        }
        return Receipt::Returned {
            output: Some(output),
        };
    }
    let taken = match take_session(context, &binding).await {
        Ok(taken) => taken,
        Err(receipt) => return receipt,
    };
    let Some(taken) = taken else {
        output["reason"] = json!("the binding holds no session");
        return Receipt::Returned {
            output: Some(output),
        };
    };
    // Tools still running on it end first: their execution resources are released before
    // the turn's cleanup.
    wait_for_running(context).await;
    output["released"] = json!(true);
    output["cleanup"] = end(context, &taken).await;
    Receipt::Returned {
        output: Some(output),
    }
}

/// Waits while executions of the binding delivered before this operation still run.
async fn wait_for_running(context: &Context) {
    loop {
        let running = context
            .state
            .brain()
            .count_running(pb::CountRunningRequest {
                binding: Some(context.binding.clone()),
                before_sequence: context.sequence,
            })
            .await;
        match running {
            Ok(answer) if answer.get_ref().running == 0 => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(status) => {
                tracing::warn!(error = %status.message(), "cannot count a binding's running tools; releasing now");
                return;
            }
        }
    }
}

fn not_set_up(context: &Context) -> Receipt {
    Receipt::failure(
        codes::NOT_ATTACHED,
        format!(
            "Environment {:?} is not set up in this session",
            context.binding.environment
        ),
        false,
    )
}

/// `detach`: the binding takes no more tools; a disposable session ends, a workspace's
/// working directory is kept for teardown.
pub async fn detach(context: &Context) -> Receipt {
    let binding = match binding(context).await {
        Ok(Some(binding)) => binding,
        Ok(None) => return Receipt::Returned { output: None },
        Err(receipt) => return receipt,
    };
    match set_state(context, pb::BindingState::Detached).await {
        Ok(_) => {}
        // A torn-down binding has nothing left to detach.
        Err(Refused::Binding(pb::BindingState::TornDown)) => {
            return Receipt::Returned { output: None };
        }
        Err(refused) => return refused.into(),
    }
    let mut output = json!({ "lifetime": lifetime(context, &binding).label() });
    if lifetime(context, &binding) == Lifetime::Disposable {
        match take_session(context, &binding).await {
            Ok(Some(taken)) => output["cleanup"] = end(context, &taken).await,
            Ok(None) => {}
            Err(receipt) => return receipt,
        }
    } else if !binding.plinth_session_id.is_empty() {
        output["kept"] = json!(binding.plinth_session_id);
    }
    Receipt::Returned {
        output: Some(output),
    }
}

/// `teardown`: every session the binding ever had is ended and its working directory removed.
pub async fn teardown(context: &Context) -> Receipt {
    let binding = match binding(context).await {
        Ok(binding) => binding,
        Err(receipt) => return receipt,
    };
    if let Some(binding) = &binding {
        if let Err(refused) = set_state(context, pb::BindingState::TornDown).await {
            return refused.into();
        }
        if let Err(receipt) = take_session(context, binding).await {
            return receipt;
        }
    }
    // By owner, not by the binding's pointer: this finds a session made just before a crash,
    // and every disposable session a release could not end, however many pages they fill.
    let mut owned = Vec::new();
    let mut after = String::new();
    loop {
        let page = context
            .state
            .sessions()
            .list_owned_sessions(pb::ListOwnedSessionsRequest {
                scope: context.scope().to_owned(),
                owner: owner(&context.binding),
                limit: OWNED_PAGE,
                after,
            })
            .await;
        let page = match page {
            Ok(page) => page.into_inner(),
            Err(status) => return receipt::from_error(&PlinthError::from_status(&status)).into(),
        };
        owned.extend(page.sessions);
        if !page.has_more || page.next.is_empty() {
            break;
        }
        after = page.next;
    }
    let mut ended = Vec::new();
    for session in owned {
        ended.push(end(context, &session.id).await);
    }
    Receipt::Returned {
        output: Some(json!({ "ended": ended })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_defaults_and_refusals() {
        let default = Configuration::parse(None).expect("default");
        assert_eq!(default.lifetime, Lifetime::Workspace);
        assert!(default.release_on_turn_end);
        assert_eq!(default.version, None);
        let asked = Configuration::parse(Some(&json!({
            "version": 2, "lifetime": "disposable", "release_on_turn_end": false, "image": "kept unread"
        })))
        .expect("parsed");
        assert_eq!(asked.version, Some(2));
        assert_eq!(asked.lifetime, Lifetime::Disposable);
        assert!(!asked.release_on_turn_end);
        for bad in [
            json!({"lifetime": "forever"}),
            json!({"version": "2"}),
            json!({"version": 0}),
            json!({"release_on_turn_end": "yes"}),
            json!([1]),
        ] {
            assert!(Configuration::parse(Some(&bad)).is_err(), "{bad}");
        }
    }
}
