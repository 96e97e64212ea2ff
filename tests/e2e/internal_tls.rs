//! TLS between services, with real processes and certificates this test makes: a catalog that
//! requires client certificates (mutual TLS), a source service that serves TLS, and a gateway
//! that reaches both over `https://`. A caller without the right certificate gets nowhere,
//! whatever credential it holds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use plinth_kit::auth::Role;
use plinth_proto::catalog::v1::ListEnvironmentsRequest;
use plinth_proto::catalog::v1::catalog_service_client::CatalogServiceClient;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::credentials::Credentials;
use crate::helpers::{create_environment_at, send};
use crate::processes::Process;

/// A certificate authority and the files of the certificates it signed.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        let key = KeyPair::generate().expect("key");
        let pki = Pki {
            dir: tempfile::tempdir().expect("dir"),
            ca: CertifiedIssuer::self_signed(params, key).expect("CA"),
        };
        std::fs::write(pki.ca_file(), pki.ca.pem()).expect("CA file");
        pki
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for `name`, valid for loopback: its (cert, key) files.
    fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("signed");
        let (cert_file, key_file) = (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).expect("cert");
        std::fs::write(&key_file, key.serialize_pem()).expect("key");
        (cert_file, key_file)
    }
}

/// `plinth` with `args` (on port 0) and these TLS settings, once ready at `probe`'s address:
/// it, and where it listens.
async fn spawn(
    args: &[&str],
    credentials: &Credentials,
    tls: &[(&str, &Path)],
    mutual: bool,
    probe: &str,
) -> (Process, crate::cluster::Bound) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plinth"));
    crate::credentials::apply(&mut command, credentials, args[0]);
    for (name, path) in tls {
        command.env(name, path);
    }
    command
        .env(
            "PLINTH_INTERNAL_TLS_REQUIRE_CLIENT_CERT",
            mutual.to_string(),
        )
        .env("PLINTH_SEAL_KEY", crate::helpers::SEAL_KEY)
        .args(args)
        .env("PLINTH_LOG", "warn")
        .env_remove("PLINTH_TOKENS")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    crate::cluster::spawn_ready(&mut command, probe).await
}

/// The code a `ListEnvironments` as the gateway ends in, over `channel`, or the connection
/// error.
async fn list(endpoint: Endpoint, credentials: &Credentials) -> Result<usize, String> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| format!("{error:?}"))?;
    CatalogServiceClient::with_interceptor(channel, credentials.interceptor(Role::Gateway))
        .list_environments(ListEnvironmentsRequest {
            scope: "default".into(),
            ..Default::default()
        })
        .await
        .map(|answer| answer.into_inner().environments.len())
        .map_err(|status| format!("{status:?}"))
}

fn tls(pki: &Pki, identity: Option<(&Path, &Path)>) -> ClientTlsConfig {
    let ca = std::fs::read(pki.ca_file()).expect("CA");
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some((cert, key)) = identity {
        config = config.identity(Identity::from_pem(
            std::fs::read(cert).expect("cert"),
            std::fs::read(key).expect("key"),
        ));
    }
    config
}

#[tokio::test]
async fn services_talk_over_tls_and_mutual_tls_refuses_callers_without_a_certificate() {
    let credentials = Credentials::new();
    let pki = Pki::new("plinth test");
    let data = tempfile::tempdir().expect("data");
    let client = crate::helpers::http_client();

    let (cert, key) = pki.issue("catalog");
    let catalog_tls = [
        ("PLINTH_INTERNAL_TLS_CERT", cert.as_path()),
        ("PLINTH_INTERNAL_TLS_KEY", key.as_path()),
        ("PLINTH_INTERNAL_TLS_CA", &pki.ca_file()),
    ];
    let database = format!("sqlite://{}/catalog.db?mode=rwc", data.path().display());
    let (_catalog_process, bound) = spawn(
        &[
            "catalog",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--database-url",
            &database,
        ],
        &credentials,
        &catalog_tls,
        true,
        "admin_listen",
    )
    .await;
    let catalog = bound["listen"];

    let (cert, key) = pki.issue("source");
    let source_db = format!("sqlite://{}/source.db?mode=rwc", data.path().display());
    let blobs = format!("file://{}/blobs", data.path().display());
    let (_source_process, bound) = spawn(
        &[
            "source",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--database-url",
            &source_db,
            "--blob-url",
            &blobs,
        ],
        &credentials,
        &[
            ("PLINTH_INTERNAL_TLS_CERT", cert.as_path()),
            ("PLINTH_INTERNAL_TLS_KEY", key.as_path()),
            ("PLINTH_INTERNAL_TLS_CA", &pki.ca_file()),
        ],
        false,
        "admin_listen",
    )
    .await;
    let source = bound["listen"];

    let (cert, key) = pki.issue("gateway");
    let (catalog_url, source_url) = (format!("https://{catalog}"), format!("https://{source}"));
    let (_gateway, bound) = spawn(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--catalog-url",
            &catalog_url,
            "--source-url",
            &source_url,
        ],
        &credentials,
        &[
            ("PLINTH_INTERNAL_TLS_CERT", cert.as_path()),
            ("PLINTH_INTERNAL_TLS_KEY", key.as_path()),
            ("PLINTH_INTERNAL_TLS_CA", &pki.ca_file()),
        ],
        false,
        "listen",
    )
    .await;
    let base = format!("http://{}", bound["listen"]);

    // The gateway reaches the catalog over mutual TLS and the source service over TLS.
    let id = &create_environment_at(&client, &base, "Over TLS").await;
    let (status, written) = send(
        client
            .put(format!("{base}/v1/environments/{id}/files/a.txt"))
            .body("sealed in transit\n"),
    )
    .await;
    assert_eq!(status, 200, "{written}");

    let catalog_endpoint = || Endpoint::from_shared(format!("https://{catalog}")).expect("url");
    // A caller with the gateway's credential but no client certificate: refused by TLS.
    let refused = list(
        catalog_endpoint().tls_config(tls(&pki, None)).expect("tls"),
        &credentials,
    )
    .await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    // One whose certificate another CA signed: refused too.
    let stranger = Pki::new("stranger");
    let (stranger_cert, stranger_key) = stranger.issue("stranger");
    let refused = list(
        catalog_endpoint()
            .tls_config(tls(&pki, Some((&stranger_cert, &stranger_key))))
            .expect("tls"),
        &credentials,
    )
    .await;
    assert!(refused.is_err(), "a stranger's certificate: {refused:?}");
    // Plain HTTP/2 to a TLS listener: nothing.
    let refused = list(
        Endpoint::from_shared(format!("http://{catalog}")).expect("url"),
        &credentials,
    )
    .await;
    assert!(refused.is_err(), "plain text: {refused:?}");
    // A certificate the deployment's CA signed, and the credential: served.
    let (cert, key) = pki.issue("operator");
    let listed = list(
        catalog_endpoint()
            .tls_config(tls(&pki, Some((&cert, &key))))
            .expect("tls"),
        &credentials,
    )
    .await;
    assert_eq!(listed, Ok(1));
    // The right certificate does not stand in for a credential.
    let channel = catalog_endpoint()
        .tls_config(tls(&pki, Some((&cert, &key))))
        .expect("tls")
        .connect()
        .await
        .expect("connect");
    let refused = CatalogServiceClient::new(channel)
        .list_environments(ListEnvironmentsRequest {
            scope: "default".into(),
            ..Default::default()
        })
        .await
        .expect_err("no credential");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    // The source service takes TLS without a client certificate (it does not require one).
    let channel = Endpoint::from_shared(format!("https://{source}"))
        .expect("url")
        .tls_config(tls(&pki, None))
        .expect("tls")
        .connect()
        .await
        .expect("a TLS connection without a client certificate");
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health over TLS");
    assert_eq!(
        health.into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

#[tokio::test]
async fn a_split_service_without_credentials_refuses_to_start_and_says_what_to_set() {
    let data = tempfile::tempdir().expect("data");
    let database = format!("sqlite://{}/catalog.db?mode=rwc", data.path().display());
    for (args, expected) in [
        (
            vec![
                "catalog".to_owned(),
                "--listen".to_owned(),
                "127.0.0.1:0".to_owned(),
                "--database-url".to_owned(),
                database.clone(),
            ],
            "PLINTH_INTERNAL_ACCEPT_FILE",
        ),
        (
            vec![
                "gateway".to_owned(),
                "--listen".to_owned(),
                "127.0.0.1:0".to_owned(),
            ],
            "PLINTH_INTERNAL_CREDENTIAL",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_plinth"))
            .args(&args)
            .env_remove("PLINTH_INTERNAL_CREDENTIAL")
            .env_remove("PLINTH_INTERNAL_ACCEPT_FILE")
            .env_remove("PLINTH_CONFIG")
            .env("PLINTH_SEAL_KEY", crate::helpers::SEAL_KEY)
            .env("PLINTH_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run plinth");
        assert!(!output.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // The one shared token of earlier versions is refused with what replaced it.
    let output = Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args(["catalog", "--database-url", &database])
        .env("PLINTH_INTERNAL_TOKEN", "an-old-shared-secret")
        .env_remove("PLINTH_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run plinth");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("per-role credentials"), "{stderr}");
}
