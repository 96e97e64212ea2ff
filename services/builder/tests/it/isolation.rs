//! What a build's commands can and cannot reach: hidden paths, the uid, writes outside the
//! scratch directory, other environments, the builder's own environment variables.

use plinth_builder::InstallOptions;

use crate::fixtures::{
    Fixtures, Scratch, build, chmod, host_env_mounts, readable_dir, require_sandbox, write,
};

#[tokio::test]
async fn the_sandbox_hides_paths_drops_privileges_and_confines_writes() {
    if !require_sandbox() {
        return;
    }
    let fixtures = Fixtures::new(None);
    // Readable by anyone on the host: only hiding keeps them from the build.
    let hidden_dir = readable_dir();
    write(hidden_dir.path(), "secret.txt", "top secret dir\n");
    chmod(&hidden_dir.path().join("secret.txt"), 0o644);
    let hidden_file_dir = readable_dir();
    write(hidden_file_dir.path(), "secret.txt", "top secret file\n");
    let hidden_file = hidden_file_dir.path().join("secret.txt");
    chmod(&hidden_file, 0o644);
    // Writable by nobody but root; and writable by everyone (sticky, like /tmp).
    let root_dir = readable_dir();
    let world_dir = readable_dir();
    chmod(world_dir.path(), 0o1777);
    let probe = format!("plinth-probe-{}", std::process::id());

    let script = format!(
        "id -u > uid.txt\n\
         id -g > gid.txt\n\
         id -G > groups.txt\n\
         {{ cat '{secret_dir}' 2>/dev/null || echo unreadable; }} > hidden-dir.txt\n\
         {{ cat '{secret_file}' 2>/dev/null || echo unreadable; }} > hidden-file.txt\n\
         {{ touch '{root_dir}/x' 2>/dev/null && echo wrote || echo denied; }} > root-dir.txt\n\
         {{ touch '{world_dir}/x' 2>/dev/null && echo wrote || echo denied; }} > world-dir.txt\n\
         {{ touch /tmp/{probe} && echo wrote || echo denied; }} > tmp.txt\n\
         {{ touch \"$HOME/x\" && echo wrote || echo denied; }} > home.txt\n\
         ls -A /env > env.txt\n\
         env | sort > vars.txt\n\
         pwd > pwd.txt\n\
         ls /proc | grep -c '^[0-9]' > processes.txt\n\
         grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status > privileges.txt\n",
        secret_dir = hidden_dir.path().join("secret.txt").display(),
        secret_file = hidden_file.display(),
        root_dir = root_dir.path().display(),
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
    assert_eq!(scratch.read("root-dir.txt"), "denied\n");
    assert_eq!(scratch.read("world-dir.txt"), "denied\n");
    assert!(!world_dir.path().join("x").exists());
    // /tmp and HOME are the build's own, and /tmp is not the host's.
    assert_eq!(scratch.read("tmp.txt"), "wrote\n");
    assert_eq!(scratch.read("home.txt"), "wrote\n");
    assert!(!std::path::Path::new("/tmp").join(&probe).exists());
    // Only this environment (and the build's HOME) under /env.
    assert_eq!(scratch.read("env.txt"), format!(".home\n{slug}\n"));
    assert_eq!(scratch.read("pwd.txt"), format!("/env/{slug}\n"));
    // Its own PID namespace: a shell, `ls`, `grep`, not the host's processes.
    let processes: u32 = scratch.read("processes.txt").trim().parse().expect("count");
    assert!(processes < 10, "{processes} processes visible");

    // No capability in any set, bounding set included, and no way to gain one.
    let privileges = scratch.read("privileges.txt");
    for line in privileges.lines() {
        let (name, value) = line.split_once(':').expect("a status line");
        let expected = if name == "NoNewPrivs" {
            "1"
        } else {
            "0000000000000000"
        };
        assert_eq!(value.trim(), expected, "{privileges}");
    }
    assert_eq!(privileges.lines().count(), 6, "{privileges}");

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
    assert_eq!(host_env_mounts(), Vec::<String>::new());
}
