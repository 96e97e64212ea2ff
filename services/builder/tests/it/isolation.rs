//! What a build's commands can and cannot reach, tested as the attacker: hidden paths, the
//! host's file system beyond the allow-listed root, the uid, capabilities and seccomp, writes
//! outside the scratch directory, other environments, the builder's own environment variables,
//! and with the network on, any port the host listens on. Traffic goes only to loopback and to
//! the build's own network namespace.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use plinth_builder::{BuildNetwork, InstallOptions, Registries};
use plinth_sandbox::egress::{Cidr, EgressPolicy};

use crate::fixtures::{
    Fixtures, Scratch, build, chmod, host_env_mounts, readable_dir, require_sandbox, write,
};

/// A directory under a system directory the sandbox shows (`/etc`), readable by anyone on
/// the host: only hiding keeps it from the build.
fn system_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("plinth-builder-test-")
        .tempdir_in("/etc")
        .expect("tempdir in /etc");
    chmod(dir.path(), 0o755);
    dir
}

#[tokio::test]
async fn the_sandbox_hides_paths_drops_privileges_and_confines_writes() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    // Beneath a system directory: covered.
    let hidden_dir = system_dir();
    write(hidden_dir.path(), "secret.txt", "top secret dir\n");
    chmod(&hidden_dir.path().join("secret.txt"), 0o644);
    let hidden_file_dir = system_dir();
    write(hidden_file_dir.path(), "secret.txt", "top secret file\n");
    let hidden_file = hidden_file_dir.path().join("secret.txt");
    chmod(&hidden_file, 0o644);
    // Outside every directory the root shows, readable by anyone, not hidden: not there.
    let elsewhere = readable_dir();
    write(elsewhere.path(), "note.txt", "not for builds\n");
    chmod(&elsewhere.path().join("note.txt"), 0o644);
    // Writable by everyone (sticky, like /tmp), beneath a read-only system directory.
    let world_dir = system_dir();
    chmod(world_dir.path(), 0o1777);
    let probe = format!("plinth-probe-{}", std::process::id());

    let script = format!(
        "id -u > uid.txt\n\
         id -g > gid.txt\n\
         id -G > groups.txt\n\
         {{ cat '{secret_dir}' 2>/dev/null || echo unreadable; }} > hidden-dir.txt\n\
         {{ cat '{secret_file}' 2>/dev/null || echo unreadable; }} > hidden-file.txt\n\
         {{ cat '{elsewhere}' 2>/dev/null || echo absent; }} > elsewhere.txt\n\
         {{ touch '{world_dir}/x' 2>/dev/null && echo wrote || echo denied; }} > world-dir.txt\n\
         for path in /usr/{probe} /etc/{probe} /{probe} /env/{probe} /dev/{probe}; do touch $path 2>/dev/null && echo \"wrote $path\"; done > system.txt\n\
         {{ touch /tmp/{probe} && echo wrote || echo denied; }} > tmp.txt\n\
         {{ touch /var/tmp/{probe}-var && echo wrote || echo denied; }} > var-tmp.txt\n\
         {{ touch \"$HOME/x\" && echo wrote || echo denied; }} > home.txt\n\
         ls -A /env > env.txt\n\
         ls -A / > root.txt\n\
         env | sort > vars.txt\n\
         pwd > pwd.txt\n\
         hostname > hostname.txt\n\
         ls /proc | grep -c '^[0-9]' > processes.txt\n\
         grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status > privileges.txt\n\
         {{ unshare -U true 2>/dev/null && echo unshared || echo refused; }} > unshare.txt\n",
        secret_dir = hidden_dir.path().join("secret.txt").display(),
        secret_file = hidden_file.display(),
        elsewhere = elsewhere.path().join("note.txt").display(),
        world_dir = world_dir.path().display(),
    );
    // Under /var/tmp, not /tmp (the build's own /tmp covers the host's anyway).
    let scratch = Scratch::new_in(std::path::Path::new("/var/tmp"), &[("setup.sh", &script)]);
    let options = InstallOptions {
        hidden_paths: vec![
            hidden_dir.path().to_owned(),
            hidden_file.clone(),
            // The directory holding the scratch directory (the builder's state, say): hiding
            // it must not hide the scratch directory from the build.
            scratch.parent.path().to_owned(),
        ],
        ..fixtures.options()
    };
    let slug = "isolated";

    let (result, log) = build(&scratch, slug, &options).await;
    result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));

    assert_eq!(scratch.read("uid.txt"), "65534\n");
    assert_eq!(scratch.read("gid.txt"), "65534\n");
    assert_eq!(
        scratch.read("groups.txt"),
        "65534\n",
        "no supplementary groups"
    );
    assert_eq!(scratch.read("hidden-dir.txt"), "unreadable\n");
    assert_eq!(
        scratch.read("hidden-file.txt"),
        "",
        "a hidden file reads as empty"
    );
    assert_eq!(scratch.read("elsewhere.txt"), "absent\n");
    assert_eq!(scratch.read("world-dir.txt"), "denied\n");
    assert!(!world_dir.path().join("x").exists());
    assert_eq!(scratch.read("system.txt"), "", "the root is read-only");
    // /tmp and HOME are the build's own, and /tmp is not the host's. The fixtures are shown
    // beneath /var/tmp, so there it is not /tmp but read-only.
    assert_eq!(scratch.read("tmp.txt"), "wrote\n");
    assert_eq!(scratch.read("var-tmp.txt"), "denied\n");
    assert_eq!(scratch.read("home.txt"), "wrote\n");
    assert!(!std::path::Path::new("/tmp").join(&probe).exists());
    // Only this environment (and the build's HOME) under /env.
    assert_eq!(scratch.read("env.txt"), format!(".home\n{slug}\n"));
    assert_eq!(scratch.read("pwd.txt"), format!("/env/{slug}\n"));
    assert_eq!(scratch.read("hostname.txt"), "build\n");
    // An allow-listed root: the system, the environment, /tmp, /var (for the fixtures).
    let root = scratch.read("root.txt");
    let root: BTreeSet<&str> = root.lines().collect();
    for absent in ["root", "home", "srv", "mnt", "run", "sys", "work", "boot"] {
        assert!(!root.contains(absent), "/{absent} is visible: {root:?}");
    }
    for present in ["env", "tmp", "usr", "proc", "dev", "etc"] {
        assert!(root.contains(present), "/{present} is missing: {root:?}");
    }
    // Its own PID namespace: a shell, `ls`, `grep`, not the host's processes.
    let processes: u32 = scratch.read("processes.txt").trim().parse().expect("count");
    assert!(processes < 10, "{processes} processes visible");

    // No capability in any set, bounding set included, no way to gain one, and the filter.
    let privileges = scratch.read("privileges.txt");
    for line in privileges.lines() {
        let (name, value) = line.split_once(':').expect("a status line");
        let expected = match name {
            "NoNewPrivs" => "1",
            "Seccomp" => "2",
            _ => "0000000000000000",
        };
        assert_eq!(value.trim(), expected, "{privileges}");
    }
    assert_eq!(privileges.lines().count(), 7, "{privileges}");
    assert_eq!(scratch.read("unshare.txt"), "refused\n");

    let vars = scratch.read("vars.txt");
    assert!(vars.contains("HOME=/env/.home\n"), "{vars}");
    assert!(vars.contains("LANG=C.UTF-8\n"), "{vars}");
    assert!(
        vars.contains(&format!("PROJECT_ROOT=/env/{slug}\n")),
        "{vars}"
    );
    for inherited in ["CARGO", "RUST", "SSH_", "AWS_"] {
        assert!(
            !vars.lines().any(|line| line.starts_with(inherited)),
            "{inherited}* leaked into the build:\n{vars}"
        );
    }
    assert!(
        !vars.to_ascii_lowercase().contains("proxy="),
        "no proxy without the network:\n{vars}"
    );
    assert_eq!(host_env_mounts(), Vec::<String>::new());
}

#[tokio::test]
async fn a_build_sees_neither_the_data_directory_nor_other_builds_nor_sessions() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    // Laid out as Plinth's: the builder's scratch directories and the node's sessions under
    // one data directory, this build's among them.
    let data = readable_dir();
    // A name no other test's file has.
    let secret = format!(
        "secret-{}.txt",
        data.path().file_name().expect("a name").to_string_lossy()
    );
    for dir in [
        "builder/builds/other/scratch",
        "node/sessions/s1/work",
        "node/cache",
    ] {
        let path = data.path().join(dir);
        std::fs::create_dir_all(&path).expect("mkdir");
        write(&path, &secret, "another tenant's\n");
        chmod(&path.join(&secret), 0o644);
    }
    let mine = data.path().join("builder/builds/mine");
    std::fs::create_dir_all(&mine).expect("mkdir");
    let data_dir = data.path().display();
    let script = format!(
        "for path in '{data_dir}' '{data_dir}/builder' '{data_dir}/builder/builds/other/scratch' \
         '{data_dir}/node/sessions/s1/work' '{data_dir}/node/cache' /home/session; do\n\
           if ls -A \"$path\" >/dev/null 2>&1; then echo \"listed $path\"; else echo \"absent $path\"; fi\n\
         done > seen.txt\n\
         find / -path /proc -prune -o -name '{secret}' -print 2>/dev/null > found.txt || true\n"
    );
    let scratch = Scratch::new_in(&mine, &[("setup.sh", &script)]);
    let options = InstallOptions {
        hidden_paths: vec![data.path().to_owned()],
        ..fixtures.options()
    };
    let (result, log) = build(&scratch, "curious", &options).await;
    result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));
    let seen = scratch.read("seen.txt");
    assert_eq!(seen.lines().count(), 6, "{seen}");
    assert!(
        seen.lines().all(|line| line.starts_with("absent ")),
        "{seen}"
    );
    assert_eq!(
        scratch.read("found.txt"),
        "",
        "another tenant's file was found"
    );
}

/// The host's listening TCP sockets, as `(address, port)` to try: a wildcard address as its
/// loopback (where whatever listens on it answers too).
fn host_listening_sockets() -> BTreeSet<(IpAddr, u16)> {
    let mut sockets = BTreeSet::new();
    for (table, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // st 0A is LISTEN.
            if fields.len() <= 3 || fields[3] != "0A" {
                continue;
            }
            let Some((addr, port)) = fields[1].split_once(':') else {
                continue;
            };
            let Ok(port) = u16::from_str_radix(port, 16) else {
                continue;
            };
            // The kernel prints each 32-bit word of the address in host (little-endian) order.
            let words: Vec<u32> = (0..addr.len() / 8)
                .filter_map(|i| u32::from_str_radix(&addr[i * 8..i * 8 + 8], 16).ok())
                .map(u32::swap_bytes)
                .collect();
            let ip = match (v6, words.as_slice()) {
                (false, [word]) => IpAddr::V4(Ipv4Addr::from(*word)),
                (true, [a, b, c, d]) => {
                    let bits = (u128::from(*a) << 96)
                        | (u128::from(*b) << 64)
                        | (u128::from(*c) << 32)
                        | u128::from(*d);
                    IpAddr::V6(Ipv6Addr::from(bits))
                }
                _ => continue,
            };
            let ip = match ip {
                IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
                other => other,
            };
            sockets.insert((ip, port));
        }
    }
    sockets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_network_a_build_reaches_what_its_policy_allows_and_no_port_the_host_listens_on() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    // A service of the host's on loopback, which must see no connection at all.
    let victim = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let victim_port = victim.local_addr().expect("bound").port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let accepting = plinth_kit::tasks::spawn(async move {
        while victim.accept().await.is_ok() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // And one the policy allows, which the build does reach, through the proxy only.
    let allowed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let allowed_port = allowed.local_addr().expect("bound").port();
    let serving = plinth_kit::tasks::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = allowed.accept().await {
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head).await;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nallowed\n",
                )
                .await;
        }
    });
    let mut sockets = host_listening_sockets();
    sockets.remove(&(IpAddr::V4(Ipv4Addr::LOCALHOST), allowed_port));
    assert!(
        sockets.contains(&(IpAddr::V4(Ipv4Addr::LOCALHOST), victim_port)),
        "{sockets:?}"
    );
    let mut probes: Vec<String> = sockets
        .iter()
        .map(|(ip, port)| format!("probe {ip} {port}"))
        .collect();
    // By name, and the cloud's metadata address.
    probes.push(format!("probe localhost {victim_port}"));
    probes.push("probe 169.254.169.254 80".to_owned());
    let script = format!(
        r#"probe() {{
  if timeout 5 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; then straight=connected; else straight=refused; fi
  host=$1; case $host in *:*) host="[$host]";; esac
  plain=$(curl -s -m 10 --noproxy '' -x "$HTTP_PROXY" -o /dev/null -w '%{{http_code}}' "http://$host:$2/")
  tunnel=$(curl -s -m 10 --noproxy '' -p -x "$HTTPS_PROXY" -o /dev/null -w '%{{http_connect}}' "http://$host:$2/")
  echo "$1 $2 $straight $plain $tunnel" >> ports.txt
}}
: > ports.txt
{probes}
curl -s -m 10 --noproxy '' -x "$HTTP_PROXY" "http://127.0.0.1:{allowed_port}/" > allowed.txt
timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/{allowed_port}" 2>/dev/null && echo connected >> allowed.txt
env | grep -i '^https\?_proxy=' | sort > proxy-env.txt
"#,
        probes = probes.join("\n")
    );
    let scratch = Scratch::new_in(std::path::Path::new("/var/tmp"), &[("setup.sh", &script)]);
    // The policy `plinth serve` gives builds: the table, the registries by name, and a deny of
    // the node's own addresses the table would let through.
    let table = EgressPolicy::default();
    let mut policy =
        EgressPolicy::from_config(&Registries::default().egress_allow().expect("entries"), &[])
            .expect("policy")
            .allow(
                format!("127.0.0.1:{allowed_port}")
                    .parse()
                    .expect("an allow entry"),
            );
    for own in plinth_sandbox::egress::node_addresses().expect("addresses") {
        if table.check(own).is_ok() {
            policy = policy.deny(Cidr::from(own));
        }
    }
    let options = InstallOptions {
        network: BuildNetwork::Egress(Arc::new(policy)),
        ..fixtures.options()
    };
    let (result, log) = build(&scratch, "attacker", &options).await;
    result.unwrap_or_else(|error| panic!("{error}\nlog:\n{log}"));

    let ports = scratch.read("ports.txt");
    assert_eq!(ports.lines().count(), probes.len(), "{ports}");
    for line in ports.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            fields.get(2..),
            Some(&["refused", "403", "403"][..]),
            "{line}\nall:\n{ports}"
        );
    }
    assert_eq!(
        scratch.read("proxy-env.txt"),
        "HTTPS_PROXY=http://127.0.0.1:3128\nHTTP_PROXY=http://127.0.0.1:3128\n\
         http_proxy=http://127.0.0.1:3128\nhttps_proxy=http://127.0.0.1:3128\n"
    );
    assert_eq!(scratch.read("allowed.txt"), "allowed\n");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
    accepting.abort();
    serving.abort();
}
