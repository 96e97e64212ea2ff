//! Quotas per scope through a real `plinth serve`, as tenants with their own tokens see them:
//! a scope at a quota is refused with `429 quota_exceeded` and `{quota, limit, used}`, other
//! scopes are served as before, a per-scope override raises one scope's limit, concurrent
//! creates at the last slot let exactly one through, a blob counts once however many
//! environments hold it, and `GET /v1/usage` reports it all.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{Server, assert_error, can_build, send, tokens_toml};
use crate::waiting::eventually;

const TOKENS: [(&str, &str); 4] = [
    ("tok-acme", "acme"),
    ("tok-globex", "globex"),
    ("tok-initech", "initech"),
    ("tok-hooli", "hooli"),
];

/// A tenant: the server and its bearer token.
struct Tenant<'a> {
    server: &'a Server,
    token: &'static str,
}

impl<'a> Tenant<'a> {
    fn of(server: &'a Server, token: &'static str) -> Self {
        Tenant { server, token }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        send(request.bearer_auth(self.token)).await
    }

    async fn create(&self, name: &str) -> (u16, Value) {
        self.send(
            self.server
                .client
                .post(self.server.url("/v1/environments"))
                .json(&json!({ "name": name })),
        )
        .await
    }

    async fn created(&self, name: &str) -> String {
        let (status, body) = self.create(name).await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().expect("id").to_owned()
    }

    async fn put(&self, id: &str, path: &str, bytes: Vec<u8>) -> (u16, Value) {
        self.send(
            self.server
                .client
                .put(
                    self.server
                        .url(&format!("/v1/environments/{id}/files/{path}")),
                )
                .body(bytes),
        )
        .await
    }

    async fn usage(&self) -> Value {
        let (status, body) = self
            .send(self.server.client.get(self.server.url("/v1/usage")))
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }
}

/// Asserts a `429 quota_exceeded` answer naming `quota`, `limit` and `used`.
fn assert_quota(status: u16, body: &Value, quota: &str, limit: u64, used: u64) {
    assert_error(status, body, 429, "quota_exceeded");
    assert_eq!(
        body["error"]["detail"],
        json!({ "quota": quota, "limit": limit, "used": used }),
        "{body}"
    );
}

/// `size` bytes that differ for each `seed`.
fn content(seed: &str, size: usize) -> Vec<u8> {
    let mut bytes = seed.as_bytes().to_vec();
    bytes.resize(size, b'#');
    bytes
}

/// A gzip'd tar holding one file of `size` bytes.
fn archive(name: &str, size: usize) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let data = content(name, size);
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, name, data.as_slice())
        .expect("append");
    builder.into_inner().expect("tar").finish().expect("gzip")
}

#[tokio::test]
async fn a_scope_at_a_quota_is_refused_and_the_others_are_served() {
    let config = format!(
        "{}\n[quotas]\nenvironments = 2\nstored_bytes = 1000\nsessions = 1\nqueued_builds = 1\n\
         [[quotas.scopes]]\nscope = \"initech\"\nenvironments = 3\nstored_bytes = 2000\n",
        tokens_toml(&TOKENS)
    );
    // No builder: a queued build stays queued.
    let server = Server::start_with_config(&config, &["--builders", "0"]).await;
    let acme = Tenant::of(&server, "tok-acme");
    let globex = Tenant::of(&server, "tok-globex");
    let initech = Tenant::of(&server, "tok-initech");

    // Environments: acme's third is refused; globex is served; initech's override is 3.
    let first = acme.created("First").await;
    let second = acme.created("Second").await;
    let (status, body) = acme.create("Third").await;
    assert_quota(status, &body, "environments", 2, 2);
    let (_, listed) = acme
        .send(server.client.get(server.url("/v1/environments")))
        .await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(2), "{listed}");
    let theirs = globex.created("Theirs").await;
    for name in ["One", "Two", "Three"] {
        initech.created(name).await;
    }
    let (status, body) = initech.create("Four").await;
    assert_quota(status, &body, "environments", 3, 3);

    // Stored bytes: the same 600 bytes in both of acme's environments count once.
    let six_hundred = content("six hundred", 600);
    let (status, body) = acme.put(&first, "data.bin", six_hundred.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = acme
        .put(&second, "copy/data.bin", six_hundred.clone())
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        acme.usage().await["quotas"]["stored_bytes"],
        json!({ "used": 600, "limit": 1000 })
    );
    // 600 more would pass 1000: refused, and nothing was stored.
    let (status, body) = acme
        .put(&first, "more.bin", content("six hundred more", 600))
        .await;
    assert_quota(status, &body, "stored_bytes", 1000, 600);
    let (status, _) = acme
        .send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{first}/files/more.bin"))),
        )
        .await;
    assert_eq!(status, 404);
    // An import past it is refused whole.
    let (status, body) = acme
        .send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{second}/import")))
                .body(archive("imported.bin", 500)),
        )
        .await;
    assert_quota(status, &body, "stored_bytes", 1000, 600);
    let (_, tree) = acme
        .send(
            server
                .client
                .get(server.url(&format!("/v1/environments/{second}/files"))),
        )
        .await;
    assert!(
        !tree.to_string().contains("imported.bin"),
        "nothing was imported: {tree}"
    );
    // The same bytes again add nothing, so they are taken at the limit's edge.
    let (status, body) = acme.put(&first, "again.bin", six_hundred.clone()).await;
    assert_eq!(status, 200, "{body}");
    // globex holds its own copy, counted for globex; initech's override lets 1500 in.
    let (status, body) = globex.put(&theirs, "data.bin", six_hundred.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(globex.usage().await["quotas"]["stored_bytes"]["used"], 600);
    let (_, listed) = initech
        .send(server.client.get(server.url("/v1/environments")))
        .await;
    let initech_env = listed["data"][0]["id"].as_str().expect("id").to_owned();
    let (status, body) = initech
        .put(&initech_env, "big.bin", content("initech", 1500))
        .await;
    assert_eq!(status, 200, "{body}");

    // Queued builds: acme's second build waits for its first; globex builds.
    let (status, body) = acme
        .send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{first}/build"))),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = acme
        .send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{second}/build"))),
        )
        .await;
    assert_quota(status, &body, "queued_builds", 1, 1);
    let (status, body) = globex
        .send(
            server
                .client
                .post(server.url(&format!("/v1/environments/{theirs}/build"))),
        )
        .await;
    assert_eq!(status, 202, "{body}");

    assert_eq!(
        acme.usage().await,
        json!({
            "object": "usage",
            "scope": "acme",
            "quotas": {
                "environments": { "used": 2, "limit": 2 },
                "stored_bytes": { "used": 600, "limit": 1000 },
                "sessions": { "used": 0, "limit": 1 },
                "queued_builds": { "used": 1, "limit": 1 }
            }
        })
    );
    assert_eq!(
        initech.usage().await["quotas"],
        json!({
            "environments": { "used": 3, "limit": 3 },
            "stored_bytes": { "used": 1500, "limit": 2000 },
            "sessions": { "used": 0, "limit": 1 },
            "queued_builds": { "used": 0, "limit": 1 }
        })
    );

    // Deleting frees what it held: an environment slot, and bytes no other file holds.
    let (status, body) = acme
        .send(
            server
                .client
                .delete(server.url(&format!("/v1/environments/{second}"))),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let usage = acme.usage().await;
    assert_eq!(usage["quotas"]["environments"]["used"], 1, "{usage}");
    assert_eq!(
        usage["quotas"]["stored_bytes"]["used"], 600,
        "the first environment still holds the blob: {usage}"
    );
    acme.created("Third").await;
    server.stop().await;
}

#[tokio::test]
async fn concurrent_creates_at_the_last_slot_let_exactly_one_through() {
    let config = format!("{}\n[quotas]\nenvironments = 3\n", tokens_toml(&TOKENS));
    let server = Server::start_with_config(&config, &["--builders", "0"]).await;
    let hooli = Tenant::of(&server, "tok-hooli");
    hooli.created("One").await;
    hooli.created("Two").await;
    let racers: Vec<_> = (0..8)
        .map(|n| {
            let request = server
                .client
                .post(server.url("/v1/environments"))
                .bearer_auth("tok-hooli")
                .json(&json!({ "name": format!("Racer {n}") }));
            plinth_kit::tasks::spawn(async move { send(request).await })
        })
        .collect();
    let mut created = 0;
    for racer in racers {
        let (status, body) = racer.await.expect("join");
        if status == 201 {
            created += 1;
        } else {
            assert_quota(status, &body, "environments", 3, 3);
        }
    }
    assert_eq!(created, 1);
    assert_eq!(
        hooli.usage().await["quotas"]["environments"],
        json!({ "used": 3, "limit": 3 })
    );
    server.stop().await;
}

/// Starts a build of `id` and waits for its end; answers the build.
async fn built(tenant: &Tenant<'_>, id: &str, version: u64) -> Value {
    let (status, body) = tenant
        .send(
            tenant
                .server
                .client
                .post(tenant.server.url(&format!("/v1/environments/{id}/build"))),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    eventually(Duration::from_secs(180), async || {
        let (_, build) = tenant
            .send(
                tenant.server.client.get(
                    tenant
                        .server
                        .url(&format!("/v1/environments/{id}/builds/{version}")),
                ),
            )
            .await;
        let ended = build["status"] == "ready" || build["status"] == "failed";
        ended.then(|| build.clone()).ok_or(build)
    })
    .await
}

#[tokio::test]
async fn sessions_and_built_layers_count_against_their_scope_only() {
    if !can_build() {
        return;
    }
    let config = format!(
        "{}\n[builder]\nnetwork = false\n[quotas]\nsessions = 1\nstored_bytes = 4096\n\
         [[quotas.scopes]]\nscope = \"globex\"\nsessions = 2\n",
        tokens_toml(&TOKENS)
    );
    let server = Server::start_with_config(&config, &[]).await;
    let acme = Tenant::of(&server, "tok-acme");
    let globex = Tenant::of(&server, "tok-globex");
    let ours = acme.created("Ours").await;
    let script = content("print('ours')\n#", 100);
    let (status, body) = acme.put(&ours, "run.py", script).await;
    assert_eq!(status, 200, "{body}");
    let build = built(&acme, &ours, 1).await;
    assert_eq!(build["status"], "ready", "{build}");
    // The built layer holds the source's file: it counts once.
    assert_eq!(
        acme.usage().await["quotas"]["stored_bytes"],
        json!({ "used": 100, "limit": 4096 })
    );
    // A build whose setup.sh writes past the scope's stored bytes fails and adds nothing.
    let bloated = acme.created("Bloated").await;
    let (status, body) = acme
        .put(
            &bloated,
            "setup.sh",
            b"head -c 8192 /dev/urandom > blob.bin\n".to_vec(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let used = acme.usage().await["quotas"]["stored_bytes"]["used"].clone();
    let build = built(&acme, &bloated, 1).await;
    assert_eq!(build["status"], "failed", "{build}");
    assert!(
        build["error"]
            .as_str()
            .is_some_and(|error| error.contains("stored-bytes quota")),
        "{build}"
    );
    assert_eq!(acme.usage().await["quotas"]["stored_bytes"]["used"], used);

    let theirs = globex.created("Theirs").await;
    let (status, body) = globex
        .put(&theirs, "run.py", b"print('theirs')\n".to_vec())
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(built(&globex, &theirs, 1).await["status"], "ready");

    // acme has one session; the second, and a task's, are refused.
    let start = |tenant: &Tenant<'_>, id: &str| {
        tenant
            .server
            .client
            .post(tenant.server.url("/v1/sessions"))
            .bearer_auth(tenant.token)
            .json(&json!({ "environment": id }))
    };
    let (status, session) = send(start(&acme, &ours)).await;
    assert_eq!(status, 201, "{session}");
    let (status, body) = send(start(&acme, &ours)).await;
    assert_quota(status, &body, "sessions", 1, 1);
    let (status, body) = acme
        .send(
            server
                .client
                .post(server.url("/v1/tasks"))
                .json(&json!({ "input": "go", "environment": ours })),
        )
        .await;
    assert_quota(status, &body, "sessions", 1, 1);
    // globex's override gives it two, whatever acme has.
    for _ in 0..2 {
        let (status, body) = send(start(&globex, &theirs)).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = send(start(&globex, &theirs)).await;
    assert_quota(status, &body, "sessions", 2, 2);
    assert_eq!(
        acme.usage().await["quotas"]["sessions"],
        json!({ "used": 1, "limit": 1 })
    );
    // Ending a session frees its slot.
    let id = session["id"].as_str().expect("id");
    let (status, body) = acme
        .send(
            server
                .client
                .delete(server.url(&format!("/v1/sessions/{id}"))),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(start(&acme, &ours)).await;
    assert_eq!(status, 201, "{body}");
    server.stop().await;
}
