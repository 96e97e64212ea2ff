//! The public gRPC face's message limit, as a client meets it: a message past 4 MiB, unary or
//! in a stream, is `RESOURCE_EXHAUSTED` with an `ErrorInfo` naming the limit, and nothing of
//! it is kept; the same bytes sent as several messages are taken.

use plinth_proto::public::v1 as public;
use tonic_types::StatusExt as _;

use crate::helpers::Server;

const LIMIT: usize = 4 * 1024 * 1024;

fn refused_for_size(status: &tonic::Status, bytes: usize) {
    assert_eq!(
        status.code(),
        tonic::Code::ResourceExhausted,
        "{}",
        status.message()
    );
    let info = status
        .get_error_details()
        .error_info()
        .cloned()
        .unwrap_or_else(|| panic!("an ErrorInfo: {status:?}"));
    assert_eq!(info.reason, "message_too_large", "{info:?}");
    assert_eq!(info.domain, "plinth", "{info:?}");
    assert_eq!(
        info.metadata.get("max_bytes").map(String::as_str),
        Some(LIMIT.to_string().as_str()),
        "{info:?}"
    );
    // The message's own size, with its field's few bytes of framing.
    let said: usize = info.metadata["bytes"].parse().expect("a size");
    assert!((bytes..bytes + 16).contains(&said), "{info:?}");
    assert!(status.message().contains("4194304"), "{}", status.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_the_limit_is_resource_exhausted_naming_it_and_keeps_nothing() {
    let server = Server::start().await;
    let channel = tonic::transport::Endpoint::from_shared(server.base.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let mut environments =
        public::environment_service_client::EnvironmentServiceClient::new(channel.clone());
    let mut files = public::file_service_client::FileServiceClient::new(channel);
    let environment = environments
        .create_environment(public::CreateEnvironmentRequest {
            name: "Limited".to_owned(),
            ..Default::default()
        })
        .await
        .expect("created")
        .into_inner();

    // Unary: a name of 5 MiB.
    let huge = "n".repeat(5 * 1024 * 1024);
    let refused = environments
        .create_environment(public::CreateEnvironmentRequest {
            name: huge,
            ..Default::default()
        })
        .await
        .expect_err("refused");
    refused_for_size(&refused, 5 * 1024 * 1024);

    // A stream whose second message is past the limit: the file is not written.
    let bytes = vec![7u8; LIMIT + 1];
    let pieces = vec![
        public::WriteFileRequest {
            environment_id: environment.id.clone(),
            path: "big.bin".to_owned(),
            data: vec![1u8; 1024].into(),
            ..Default::default()
        },
        public::WriteFileRequest {
            data: bytes.clone().into(),
            ..Default::default()
        },
    ];
    let refused = files
        .write_file(futures::stream::iter(pieces))
        .await
        .expect_err("refused");
    refused_for_size(&refused, LIMIT + 1);
    let missing = files
        .read_file(public::ReadFileRequest {
            environment_id: environment.id.clone(),
            path: "big.bin".to_owned(),
        })
        .await;
    let missing = match missing {
        Err(status) => status,
        Ok(stream) => {
            let mut stream = stream.into_inner();
            stream
                .message()
                .await
                .expect_err("no such file: the stream fails")
        }
    };
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");

    // The same bytes over several messages are taken.
    let mut pieces = vec![public::WriteFileRequest {
        environment_id: environment.id.clone(),
        path: "big.bin".to_owned(),
        ..Default::default()
    }];
    pieces.extend(
        bytes
            .chunks(1024 * 1024)
            .map(|chunk| public::WriteFileRequest {
                data: chunk.to_vec().into(),
                ..Default::default()
            }),
    );
    let written = files
        .write_file(futures::stream::iter(pieces))
        .await
        .expect("written in pieces")
        .into_inner();
    assert_eq!(written.size, bytes.len() as u64);
    server.stop().await;
}
