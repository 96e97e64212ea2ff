//! The tenant API over gRPC (`proto/plinth/v1`), on the gateway's own address beside REST.
//!
//! Every `plinth.v1` RPC is a REST operation, named by its `google.api.http` option; a call is
//! translated into that operation and answered by the same REST router, in this process,
//! through the same layers (token → scope, rate, in-flight and deadline limits, query rules).
//! So the two faces cannot disagree on a rule or an error: there is one implementation, and
//! the proto declares only the shapes. A request with `content-type: application/grpc…` is
//! gRPC; anything else is REST.
//!
//! - Unary RPCs: the request's fields fill the path, then the JSON body (`body: "*"`) or the
//!   query; the JSON answer becomes the response message (`json.rs`).
//! - Client-streaming uploads (`body: "data"`): the first message fills the path and query;
//!   every message's `data` streams as the request body, never buffered whole.
//! - Server-streaming downloads (`response_body: "data"`): the answer's bytes stream as
//!   chunks. Other server-streaming RPCs ask for newline-delimited JSON
//!   (`Accept: application/x-ndjson`) and answer one message per line.
//! - Errors: REST's `{"error": {code, message, detail}}` becomes the status the internal
//!   services send (`PlinthError::to_status`: the gRPC code from the error table, the Plinth
//!   code in a `google.rpc.ErrorInfo`).
//! - Deadlines: a call's `grpc-timeout` bounds it whole, a streamed answer to its last
//!   message. Past it the call ends `DEADLINE_EXCEEDED` and its REST operation is dropped, as
//!   when a REST client hangs up: a command it runs is killed with its process tree. A call
//!   the client cancels is dropped the same way.
//!
//! Reflection (v1 and v1alpha) and `grpc.health.v1` on this address list only `plinth.v1`
//! and themselves: the internal services are not served here.

mod json;
pub mod limit;
mod rules;

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, TryStreamExt};
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt;
use plinth_kit::{ErrorCode, PlinthError};
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor};
use tokio::time::Instant;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{ClientStreamingService, Grpc, ServerStreamingService, UnaryService};
use tonic::{Status, Streaming};
use tower::ServiceExt as _;

use self::rules::{Body as BodyRule, Rule};

/// Bytes of a streamed download per message; the default gRPC client takes up to 4 MiB.
const CHUNK_BYTES: usize = 1024 * 1024;

/// Metadata passed on to the REST operation as headers: the credential, the trace, and an
/// idempotency key.
const FORWARDED: &[&str] = &[
    "authorization",
    "traceparent",
    "tracestate",
    "idempotency-key",
];

/// `rest` with the gRPC face in front of it: gRPC requests go to `plinth.v1` (or reflection
/// and health), everything else to `rest` as before. If the public descriptor set does not
/// load (a build defect), REST is served alone and the error logged.
pub fn beside(rest: Router) -> Router {
    match PublicApi::new(rest.clone()) {
        Ok(api) => Router::new().fallback_service(tower::service_fn(move |request| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.dispatch(request).await) }
        })),
        Err(error) => {
            tracing::error!(%error, "the gRPC tenant API is off: its descriptor set does not load");
            rest
        }
    }
}

/// The `plinth.v1` RPCs and what answers them.
#[derive(Clone)]
struct PublicApi {
    rpcs: Arc<HashMap<String, Arc<Rpc>>>,
    rest: Router,
    reflection: Router,
    meter: plinth_kit::grpc::ServerMeter,
}

/// One RPC: its descriptor and its HTTP binding.
struct Rpc {
    descriptor: MethodDescriptor,
    rule: Rule,
}

impl PublicApi {
    fn new(rest: Router) -> Result<PublicApi, String> {
        let pool = DescriptorPool::decode(plinth_proto::PUBLIC_DESCRIPTOR_SET)
            .map_err(|error| error.to_string())?;
        let mut rpcs = HashMap::new();
        let mut names = Vec::new();
        for service in pool.services() {
            if service.package_name() != "plinth.v1" {
                continue;
            }
            names.push(service.full_name().to_owned());
            for method in service.methods() {
                let rule = Rule::of(&method).map_err(|error| error.to_string())?;
                rpcs.insert(
                    format!("/{}/{}", service.full_name(), method.name()),
                    Arc::new(Rpc {
                        descriptor: method,
                        rule,
                    }),
                );
            }
        }
        let served: Vec<&str> = names.iter().map(String::as_str).collect();
        let meter =
            plinth_kit::grpc::ServerMeter::new(plinth_proto::PUBLIC_DESCRIPTOR_SET, &served);
        Ok(PublicApi {
            rpcs: Arc::new(rpcs),
            rest,
            reflection: reflection(&names)?,
            meter,
        })
    }

    async fn dispatch(&self, request: http::Request<Body>) -> http::Response<Body> {
        let grpc = request
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
        if !grpc {
            return self.rest.clone().oneshot(request).await.unwrap_infallible();
        }
        // Counted as gRPC calls with their own status (health and reflection too), besides
        // the REST route a `plinth.v1` call is answered by.
        self.meter
            .call(request, |request| async move {
                self.answer_grpc(request).await.map(tonic::body::Body::new)
            })
            .await
            .map(Body::new)
    }

    /// A gRPC request's answer: `plinth.v1`, or reflection and health.
    async fn answer_grpc(&self, request: http::Request<Body>) -> http::Response<Body> {
        let path = request.uri().path();
        if path.starts_with("/grpc.reflection.") || path.starts_with("/grpc.health.") {
            return self
                .reflection
                .clone()
                .oneshot(request)
                .await
                .unwrap_infallible();
        }
        let Some(rpc) = self.rpcs.get(path).cloned() else {
            let status = Status::unimplemented(format!(
                "{path} is not served here: this address serves plinth.v1 (list it with reflection)"
            ));
            return status.into_http::<Body>();
        };
        // A message past the limit is refused from its length prefix, before it is read.
        let request = request.map(|body| Body::new(limit::Limited::new(body)));
        let call = Call {
            rpc: rpc.clone(),
            rest: self.rest.clone(),
            deadline: grpc_timeout(request.headers()).map(|timeout| Instant::now() + timeout),
        };
        let mut grpc = Grpc::new(DynamicCodec {
            input: rpc.descriptor.input(),
        });
        let response = match (
            rpc.descriptor.is_client_streaming(),
            rpc.descriptor.is_server_streaming(),
        ) {
            (false, false) => grpc.unary(call, request).await,
            (false, true) => grpc.server_streaming(call, request).await,
            (true, false) => grpc.client_streaming(call, request).await,
            (true, true) => Status::unimplemented("bidirectional streams are not served")
                .into_http::<tonic::body::Body>(),
        };
        response.map(Body::new)
    }
}

trait UnwrapInfallible<T> {
    fn unwrap_infallible(self) -> T;
}

impl<T> UnwrapInfallible<T> for Result<T, Infallible> {
    fn unwrap_infallible(self) -> T {
        match self {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }
}

/// Reflection v1 and v1alpha, and health, listing `services` and themselves.
fn reflection(services: &[String]) -> Result<Router, String> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(health);
    let listed: Vec<&str> = services
        .iter()
        .map(String::as_str)
        .chain(["grpc.health.v1.Health"])
        .collect();
    plinth_kit::grpc::add_reflection(&mut routes, plinth_proto::PUBLIC_DESCRIPTOR_SET, &listed)
        .map_err(|error| error.to_string())?;
    let names = services.to_vec();
    plinth_kit::tasks::spawn(async move {
        for name in names {
            reporter
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
        }
    });
    Ok(routes.routes().into_axum_router())
}

/// Encodes and decodes the messages of one RPC by its descriptors.
#[derive(Clone)]
struct DynamicCodec {
    input: MessageDescriptor,
}

struct DynamicEncoder;

struct DynamicDecoder(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;

    fn encoder(&mut self) -> DynamicEncoder {
        DynamicEncoder
    }

    fn decoder(&mut self) -> DynamicDecoder {
        DynamicDecoder(self.input.clone())
    }
}

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|error| Status::internal(format!("encoding the answer: {error}")))
    }
}

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        DynamicMessage::decode(self.0.clone(), src)
            .map(Some)
            .map_err(|error| {
                PlinthError::invalid(format!(
                    "the request is not a {}: {error}",
                    self.0.full_name()
                ))
                .to_status()
            })
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type MessageStream = Pin<Box<dyn Stream<Item = Result<DynamicMessage, Status>> + Send>>;

/// One call of one RPC.
#[derive(Clone)]
struct Call {
    rpc: Arc<Rpc>,
    rest: Router,
    /// When the caller stops waiting (its `grpc-timeout`), if it said.
    deadline: Option<Instant>,
}

/// The most digits a `grpc-timeout` value has (the gRPC spec's `TimeoutValue`).
const TIMEOUT_DIGITS: usize = 8;

/// How long a call may take by its `grpc-timeout` header (`TimeoutValue TimeoutUnit`: up to
/// eight digits, then `H`, `M`, `S`, `m`, `u` or `n`); none when it has none, or one that is
/// not of that form (the call is then bounded as a REST request is).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty()
        || digits.len() > TIMEOUT_DIGITS
        || !digits.bytes().all(|byte| byte.is_ascii_digit())
    {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

fn deadline_passed() -> Status {
    Status::deadline_exceeded(
        "the call's deadline (its grpc-timeout) passed before it ended; it was stopped there, \
         and a command it ran was killed",
    )
}

/// `work`, cut off at `deadline`.
async fn within<T>(
    deadline: Option<Instant>,
    work: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match deadline {
        None => work.await,
        Some(at) => tokio::time::timeout_at(at, work)
            .await
            .unwrap_or_else(|_| Err(deadline_passed())),
    }
}

/// `stream`, ended with `DEADLINE_EXCEEDED` at `deadline`; what it streams (and the REST
/// operation behind it) is dropped there.
fn until(stream: MessageStream, deadline: Option<Instant>) -> MessageStream {
    let Some(at) = deadline else {
        return stream;
    };
    let passed = Box::pin(tokio::time::sleep_until(at));
    Box::pin(futures::stream::unfold(
        Some((stream, passed)),
        |state| async move {
            let (mut stream, mut passed) = state?;
            tokio::select! {
                () = &mut passed => {
                    drop(stream);
                    Some((Err(deadline_passed()), None))
                }
                next = stream.next() => Some((next?, Some((stream, passed)))),
            }
        },
    ))
}

impl Call {
    /// The REST request for `message` (the first of a stream), with `upload` as its body when
    /// the RPC streams one.
    fn rest_request(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        message: &DynamicMessage,
        upload: Option<Body>,
    ) -> Result<http::Request<Body>, Status> {
        let rule = &self.rpc.rule;
        let mut fields = json::rest_fields(message, rule.body == BodyRule::All)
            .map_err(|error| internal(&error.to_string()))?;
        let path = rule
            .path(&mut fields)
            .map_err(|missing| PlinthError::invalid(missing.to_string()).to_status())?;
        let mut builder = http::Request::builder().method(rule.method.clone());
        let (query, body) = match &rule.body {
            BodyRule::All => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                let body =
                    serde_json::to_vec(&fields).map_err(|error| internal(&error.to_string()))?;
                (serde_json::Map::new(), Body::from(body))
            }
            BodyRule::None => (fields, Body::empty()),
            BodyRule::Bytes(name) => {
                fields.remove(name);
                builder = builder.header(CONTENT_TYPE, "application/octet-stream");
                (fields, upload.unwrap_or_else(Body::empty))
            }
        };
        let mut uri = path;
        let mut separator = '?';
        for (key, value) in &query {
            let values = match value {
                serde_json::Value::Array(items) => items.clone(),
                other => vec![other.clone()],
            };
            for value in values {
                uri.push(separator);
                separator = '&';
                uri.push_str(&rules::encode(key));
                uri.push('=');
                uri.push_str(&rules::encode(&rules::scalar(&value)));
            }
        }
        if self.rpc.descriptor.is_server_streaming() && rule.response_body.is_none() {
            builder = builder.header(ACCEPT, "application/x-ndjson");
        }
        for name in FORWARDED {
            if let Some(value) = metadata
                .get(*name)
                .and_then(|value| HeaderValue::from_bytes(value.as_bytes()).ok())
            {
                builder = builder.header(*name, value);
            }
        }
        if metadata.get(AUTHORIZATION.as_str()).is_none() {
            tracing::debug!(
                rpc = self.rpc.descriptor.full_name(),
                "gRPC call without authorization"
            );
        }
        builder
            .uri(uri)
            .body(body)
            .map_err(|error| PlinthError::invalid(format!("request: {error}")).to_status())
    }

    /// Sends `request` to REST; a non-2xx answer becomes its error's status.
    async fn send(&self, request: http::Request<Body>) -> Result<http::Response<Body>, Status> {
        let response = self.rest.clone().oneshot(request).await.unwrap_infallible();
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        Err(error_status(status, &body))
    }

    /// A JSON answer as the RPC's response message.
    async fn answer(&self, response: http::Response<Body>) -> Result<DynamicMessage, Status> {
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| unavailable())?
            .to_bytes();
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|error| internal(&error.to_string()))?;
        json::message_from_rest(&self.rpc.descriptor.output(), value)
            .map_err(|error| internal(&error.to_string()))
    }
}

/// REST's error answer as the status a Plinth gRPC service sends.
fn error_status(status: http::StatusCode, body: &[u8]) -> Status {
    #[derive(serde::Deserialize)]
    struct Envelope {
        error: Object,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        code: String,
        message: String,
        #[serde(default)]
        detail: Option<serde_json::Value>,
    }
    let Ok(envelope) = serde_json::from_slice::<Envelope>(body) else {
        return internal(&format!("REST answered {status} without an error body"));
    };
    let code = ErrorCode::parse(&envelope.error.code).unwrap_or(ErrorCode::Internal);
    let mut error = PlinthError::new(code, envelope.error.message);
    if let Some(detail) = envelope.error.detail {
        error = error.with_detail(detail);
    }
    error.to_status()
}

fn internal(cause: &str) -> Status {
    tracing::error!(%cause, "gRPC tenant API: a REST answer did not translate");
    PlinthError::new(
        ErrorCode::Internal,
        "internal error; the server log has the cause",
    )
    .to_status()
}

fn unavailable() -> Status {
    PlinthError::new(
        ErrorCode::Unavailable,
        "the answer was cut off before its end; retry",
    )
    .to_status()
}

impl UnaryService<DynamicMessage> for Call {
    type Response = DynamicMessage;
    type Future = BoxFuture<Result<tonic::Response<DynamicMessage>, Status>>;

    fn call(&mut self, request: tonic::Request<DynamicMessage>) -> Self::Future {
        let call = self.clone();
        let deadline = call.deadline;
        Box::pin(within(deadline, async move {
            let (metadata, _, message) = request.into_parts();
            let request = call.rest_request(&metadata, &message, None)?;
            let response = call.send(request).await?;
            Ok(tonic::Response::new(call.answer(response).await?))
        }))
    }
}

impl ClientStreamingService<DynamicMessage> for Call {
    type Response = DynamicMessage;
    type Future = BoxFuture<Result<tonic::Response<DynamicMessage>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<DynamicMessage>>) -> Self::Future {
        let call = self.clone();
        let deadline = call.deadline;
        Box::pin(within(deadline, async move {
            let (metadata, _, mut stream) = request.into_parts();
            let first = stream.message().await?.ok_or_else(|| {
                PlinthError::invalid("the stream ended before its first message").to_status()
            })?;
            let BodyRule::Bytes(field) = call.rpc.rule.body.clone() else {
                return Err(internal("a client-streaming RPC without a bytes body"));
            };
            let head = rules::bytes_field(&first, &field);
            let tail = stream
                .map_ok(move |message| rules::bytes_field(&message, &field))
                .map_err(|status| std::io::Error::other(status.message().to_owned()));
            let upload =
                Body::from_stream(futures::stream::once(async move { Ok(head) }).chain(tail));
            let request = call.rest_request(&metadata, &first, Some(upload))?;
            let response = call.send(request).await?;
            Ok(tonic::Response::new(call.answer(response).await?))
        }))
    }
}

impl ServerStreamingService<DynamicMessage> for Call {
    type Response = DynamicMessage;
    type ResponseStream = MessageStream;
    type Future = BoxFuture<Result<tonic::Response<MessageStream>, Status>>;

    fn call(&mut self, request: tonic::Request<DynamicMessage>) -> Self::Future {
        let call = self.clone();
        let deadline = call.deadline;
        Box::pin(within(deadline, async move {
            let (metadata, _, message) = request.into_parts();
            let request = call.rest_request(&metadata, &message, None)?;
            let response = call.send(request).await?;
            let output = call.rpc.descriptor.output();
            let data = response.into_body().into_data_stream();
            let stream: MessageStream = match call.rpc.rule.response_body.clone() {
                Some(field) => Box::pin(chunks(data, output, field)),
                None => Box::pin(lines(data, output)),
            };
            Ok(tonic::Response::new(until(stream, deadline)))
        }))
    }
}

/// A raw answer as messages carrying up to [`CHUNK_BYTES`] each in `field`.
fn chunks(
    data: axum::body::BodyDataStream,
    output: MessageDescriptor,
    field: String,
) -> impl Stream<Item = Result<DynamicMessage, Status>> + Send {
    data.map(move |frame| {
        let frame = frame.map_err(|_| unavailable())?;
        let mut messages = Vec::new();
        for piece in frame.chunks(CHUNK_BYTES) {
            let mut message = DynamicMessage::new(output.clone());
            message
                .try_set_field_by_name(
                    &field,
                    prost_reflect::Value::Bytes(Bytes::copy_from_slice(piece)),
                )
                .map_err(|error| internal(&error.to_string()))?;
            messages.push(Ok(message));
        }
        Ok::<_, Status>(futures::stream::iter(messages))
    })
    .flat_map(|batch| match batch {
        Ok(messages) => messages.left_stream(),
        Err(status) => futures::stream::once(async move { Err(status) }).right_stream(),
    })
}

/// A newline-delimited JSON answer as one message per line. A body cut off mid-way ends the
/// stream with `unavailable`.
fn lines(
    data: axum::body::BodyDataStream,
    output: MessageDescriptor,
) -> impl Stream<Item = Result<DynamicMessage, Status>> + Send {
    let parse = move |line: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(line)
            .map_err(|error| internal(&error.to_string()))
            .and_then(|value| {
                json::message_from_rest(&output, value)
                    .map_err(|error| internal(&error.to_string()))
            })
    };
    futures::stream::unfold(
        (data, BytesMut::new(), false),
        move |(mut data, mut pending, mut ended)| {
            let parse = parse.clone();
            async move {
                loop {
                    if let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
                        let line = pending.split_to(end + 1);
                        if line.trim_ascii().is_empty() {
                            continue;
                        }
                        return Some((parse(line.trim_ascii()), (data, pending, ended)));
                    }
                    if ended {
                        let rest = pending.split();
                        if rest.trim_ascii().is_empty() {
                            return None;
                        }
                        return Some((parse(rest.trim_ascii()), (data, pending, true)));
                    }
                    match data.next().await {
                        Some(Ok(frame)) => pending.extend_from_slice(&frame),
                        Some(Err(_)) => {
                            pending.clear();
                            return Some((Err(unavailable()), (data, pending, true)));
                        }
                        None => ended = true,
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_of(value: &str) -> Option<Duration> {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "grpc-timeout",
            HeaderValue::from_str(value).expect("a header value"),
        );
        grpc_timeout(&headers)
    }

    #[test]
    fn a_grpc_timeout_is_up_to_eight_digits_and_a_unit() {
        assert_eq!(timeout_of("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout_of("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            timeout_of("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout_of("5n"), Some(Duration::from_nanos(5)));
        for malformed in ["", "S", "123456789S", "1s", "1.5S", "-1S", "1 S"] {
            assert_eq!(timeout_of(malformed), None, "{malformed:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }
}
