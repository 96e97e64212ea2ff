//! gRPC server reflection, v1 and v1alpha (which many tools still speak), over descriptor
//! sets given as encoded bytes.
//!
//! Two promises that tonic-reflection's own server does not keep, and that clients such as
//! `buf curl` and `grpcurl` rely on:
//! - a service is listed only when its descriptor is here to be asked for, so every listed
//!   name can be described (both reflection versions' own descriptors are registered, so each
//!   version describes itself and the other);
//! - a lookup that fails (an unknown symbol or file) is answered with an `error_response` on
//!   the stream, and the stream goes on to answer the next request; only a broken stream ends
//!   it.
//!
//! Each file is served as the bytes it was registered with (never decoded and encoded again),
//! so custom options such as `google.api.http` reach the client.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto};
use tonic::{Request, Response, Status, Streaming};
use tonic_reflection::pb::{v1, v1alpha};

/// The reflection services themselves.
pub const REFLECTION_SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// A descriptor set that does not load.
#[derive(Debug, thiserror::Error)]
#[error("the descriptor set does not load: {0}")]
pub struct ReflectionError(String);

/// What reflection knows: every registered file by name, every symbol (package-qualified
/// message, enum, enum value, field, oneof, service and method) by the file that declares
/// it, and the services listed.
#[derive(Debug, Default)]
pub struct Descriptors {
    files: HashMap<String, Arc<[u8]>>,
    symbols: HashMap<String, Arc<[u8]>>,
    services: Vec<String>,
}

impl Descriptors {
    /// Reads `sets` (encoded `FileDescriptorSet`s; a file seen twice keeps its first bytes)
    /// and both reflection versions' own, then lists those of `services` (and the reflection
    /// services) that they describe. A name they do not describe is left out, and logged.
    pub fn new(sets: &[&[u8]], services: &[&str]) -> Result<Self, ReflectionError> {
        let mut descriptors = Descriptors::default();
        for set in sets
            .iter()
            .copied()
            .chain([v1::FILE_DESCRIPTOR_SET, v1alpha::FILE_DESCRIPTOR_SET])
        {
            for raw in split_file_descriptor_set(set)? {
                descriptors.register(raw)?;
            }
        }
        for name in services.iter().copied().chain(REFLECTION_SERVICES) {
            if descriptors.services.iter().any(|listed| listed == name) {
                continue;
            }
            if descriptors.symbols.contains_key(name) {
                descriptors.services.push(name.to_owned());
            } else {
                tracing::warn!(
                    service = name,
                    "not listed by reflection: no descriptor describes it"
                );
            }
        }
        Ok(descriptors)
    }

    /// The services listed, in the order given.
    pub fn services(&self) -> &[String] {
        &self.services
    }

    fn register(&mut self, raw: Vec<u8>) -> Result<(), ReflectionError> {
        let file = FileDescriptorProto::decode(raw.as_slice())
            .map_err(|error| ReflectionError(error.to_string()))?;
        let name = file
            .name
            .clone()
            .ok_or_else(|| ReflectionError("a file has no name".to_owned()))?;
        if self.files.contains_key(&name) {
            return Ok(());
        }
        let raw: Arc<[u8]> = Arc::from(raw);
        self.files.insert(name, raw.clone());
        let package = file.package.clone().unwrap_or_default();
        let mut symbols = Vec::new();
        for message in &file.message_type {
            message_symbols(&package, message, &mut symbols);
        }
        for en in &file.enum_type {
            enum_symbols(&package, en, &mut symbols);
        }
        for service in &file.service {
            let service_name = qualified(&package, service.name());
            for method in &service.method {
                symbols.push(qualified(&service_name, method.name()));
            }
            symbols.push(service_name);
        }
        for symbol in symbols {
            self.symbols.entry(symbol).or_insert_with(|| raw.clone());
        }
        Ok(())
    }

    fn file_by_name(&self, name: &str) -> Result<Vec<u8>, String> {
        self.files.get(name).map(|raw| raw.to_vec()).ok_or_else(|| {
            format!("no file {name:?} is described here; list the services to see what is")
        })
    }

    fn file_containing(&self, symbol: &str) -> Result<Vec<u8>, String> {
        self.symbols
            .get(symbol)
            .map(|raw| raw.to_vec())
            .ok_or_else(|| {
                format!("no symbol {symbol:?} is described here; list the services to see what is")
            })
    }
}

fn qualified(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

fn message_symbols(prefix: &str, message: &DescriptorProto, out: &mut Vec<String>) {
    let name = qualified(prefix, message.name());
    for nested in &message.nested_type {
        message_symbols(&name, nested, out);
    }
    for en in &message.enum_type {
        enum_symbols(&name, en, out);
    }
    for field in &message.field {
        out.push(qualified(&name, field.name()));
    }
    for oneof in &message.oneof_decl {
        out.push(qualified(&name, oneof.name()));
    }
    out.push(name);
}

fn enum_symbols(prefix: &str, en: &EnumDescriptorProto, out: &mut Vec<String>) {
    let name = qualified(prefix, en.name());
    for value in &en.value {
        // Enum values are scoped beside their enum, as protobuf scopes them, and also under it.
        out.push(qualified(prefix, value.name()));
        out.push(qualified(&name, value.name()));
    }
    out.push(name);
}

/// The encoded `FileDescriptorProto`s of an encoded `FileDescriptorSet` (field 1), as they
/// are, without decoding them.
fn split_file_descriptor_set(mut buf: &[u8]) -> Result<Vec<Vec<u8>>, ReflectionError> {
    let broken = |what: &str| ReflectionError(what.to_owned());
    let mut files = Vec::new();
    while !buf.is_empty() {
        let (tag, wire_type) =
            decode_key(&mut buf).map_err(|error| ReflectionError(error.to_string()))?;
        let skip = match wire_type {
            WireType::LengthDelimited => {
                let len =
                    decode_varint(&mut buf).map_err(|error| ReflectionError(error.to_string()))?;
                let len = usize::try_from(len).map_err(|_| broken("a field is too long"))?;
                let field = buf
                    .get(..len)
                    .ok_or_else(|| broken("the set is cut short"))?;
                if tag == 1 {
                    files.push(field.to_vec());
                }
                len
            }
            WireType::Varint => {
                decode_varint(&mut buf).map_err(|error| ReflectionError(error.to_string()))?;
                0
            }
            WireType::ThirtyTwoBit => 4,
            WireType::SixtyFourBit => 8,
            WireType::StartGroup | WireType::EndGroup => {
                return Err(broken("the set holds a group"));
            }
        };
        buf = buf
            .get(skip..)
            .ok_or_else(|| broken("the set is cut short"))?;
    }
    Ok(files)
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// One reflection version's server over shared [`Descriptors`]: the two versions' messages
/// are distinct generated types of the same shape.
macro_rules! reflection_version {
    ($service:ident, $version:ident) => {
        /// Reflection
        #[doc = concat!("`grpc.reflection.", stringify!($version), "`")]
        /// over shared [`Descriptors`].
        #[derive(Debug, Clone)]
        pub struct $service(pub Arc<Descriptors>);

        impl $service {
            fn answer(
                &self,
                request: $version::ServerReflectionRequest,
            ) -> $version::ServerReflectionResponse {
                use $version::server_reflection_request::MessageRequest;
                use $version::server_reflection_response::MessageResponse;
                let descriptors = &self.0;
                let described = |found: Result<Vec<u8>, String>| {
                    found.map(|file| {
                        MessageResponse::FileDescriptorResponse($version::FileDescriptorResponse {
                            file_descriptor_proto: vec![file],
                        })
                    })
                };
                let answer = match &request.message_request {
                    None => Err((
                        tonic::Code::InvalidArgument,
                        "the request names nothing to look up".to_owned(),
                    )),
                    Some(MessageRequest::FileByFilename(name)) => {
                        described(descriptors.file_by_name(name))
                            .map_err(|error| (tonic::Code::NotFound, error))
                    }
                    Some(MessageRequest::FileContainingSymbol(symbol)) => {
                        described(descriptors.file_containing(symbol))
                            .map_err(|error| (tonic::Code::NotFound, error))
                    }
                    Some(MessageRequest::FileContainingExtension(_)) => Err((
                        tonic::Code::NotFound,
                        "extensions are not described here".to_owned(),
                    )),
                    // Clients such as grpcurl expect this to succeed: no extensions.
                    Some(MessageRequest::AllExtensionNumbersOfType(name)) => {
                        Ok(MessageResponse::AllExtensionNumbersResponse(
                            $version::ExtensionNumberResponse {
                                base_type_name: name.clone(),
                                extension_number: Vec::new(),
                            },
                        ))
                    }
                    Some(MessageRequest::ListServices(_)) => Ok(
                        MessageResponse::ListServicesResponse($version::ListServiceResponse {
                            service: descriptors
                                .services()
                                .iter()
                                .map(|name| $version::ServiceResponse { name: name.clone() })
                                .collect(),
                        }),
                    ),
                };
                let message = answer.unwrap_or_else(|(code, message)| {
                    MessageResponse::ErrorResponse($version::ErrorResponse {
                        error_code: code as i32,
                        error_message: message,
                    })
                });
                $version::ServerReflectionResponse {
                    valid_host: request.host.clone(),
                    original_request: Some(request),
                    message_response: Some(message),
                }
            }
        }

        #[tonic::async_trait]
        impl $version::server_reflection_server::ServerReflection for $service {
            type ServerReflectionInfoStream = Answers<$version::ServerReflectionResponse>;

            async fn server_reflection_info(
                &self,
                request: Request<Streaming<$version::ServerReflectionRequest>>,
            ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
                let this = self.clone();
                // Each request is answered in turn; a broken request stream ends the answers.
                let answers = request
                    .into_inner()
                    .map(move |request| request.map(|request| this.answer(request)));
                Ok(Response::new(Box::pin(answers)))
            }
        }
    };
}

reflection_version!(ReflectionV1, v1);
reflection_version!(ReflectionV1alpha, v1alpha);

/// The v1 and v1alpha reflection servers over `descriptors`.
pub fn servers(
    descriptors: Descriptors,
) -> (
    v1::server_reflection_server::ServerReflectionServer<ReflectionV1>,
    v1alpha::server_reflection_server::ServerReflectionServer<ReflectionV1alpha>,
) {
    let descriptors = Arc::new(descriptors);
    (
        v1::server_reflection_server::ServerReflectionServer::new(ReflectionV1(
            descriptors.clone(),
        )),
        v1alpha::server_reflection_server::ServerReflectionServer::new(ReflectionV1alpha(
            descriptors,
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_only_what_it_describes_and_both_reflection_versions() {
        let descriptors = Descriptors::new(
            &[tonic_health::pb::FILE_DESCRIPTOR_SET],
            &["grpc.health.v1.Health", "nowhere.v1.Missing"],
        )
        .expect("loads");
        assert_eq!(
            descriptors.services(),
            [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ]
        );
        for name in descriptors.services() {
            assert!(descriptors.file_containing(name).is_ok(), "{name}");
        }
        assert!(
            descriptors
                .file_containing("grpc.health.v1.HealthCheckResponse.ServingStatus")
                .is_ok()
        );
        assert!(descriptors.file_containing("nowhere.v1.Missing").is_err());
    }

    #[test]
    fn a_failed_lookup_is_an_error_response_and_the_next_is_answered() {
        use v1::server_reflection_request::MessageRequest;
        use v1::server_reflection_response::MessageResponse;
        let server = ReflectionV1(Arc::new(
            Descriptors::new(&[tonic_health::pb::FILE_DESCRIPTOR_SET], &[]).expect("loads"),
        ));
        let ask = |symbol: &str| v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(symbol.to_owned())),
        };
        match server.answer(ask("nowhere.Missing")).message_response {
            Some(MessageResponse::ErrorResponse(error)) => {
                assert_eq!(error.error_code, tonic::Code::NotFound as i32);
                assert!(error.error_message.contains("nowhere.Missing"));
            }
            other => panic!("{other:?}"),
        }
        match server.answer(ask("grpc.health.v1.Health")).message_response {
            Some(MessageResponse::FileDescriptorResponse(files)) => {
                assert_eq!(files.file_descriptor_proto.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    }
}
