//! Which cgroup hierarchy limits sessions, decided from the text of `/proc/self/mountinfo` and
//! `/proc/self/cgroup` alone, so every decision can be tested on fixtures of the layouts nodes
//! really have (pure v2, v1, hybrid, in a container's cgroup namespace or not).
//!
//! Groups are made below the node's own cgroup in each hierarchy, not below the root: the
//! node's limits (a Kubernetes pod's, a systemd unit's) then cover its sessions too, and a
//! node in a container only needs the cgroup tree it was given.

use std::path::{Path, PathBuf};

use super::CgroupError;

/// The controllers a session is limited by.
pub(super) const REQUIRED: [&str; 3] = ["memory", "pids", "cpu"];
/// v1 controllers joined when mounted: CPU time used (`cpuacct`) and freezing before a kill
/// (`freezer`).
pub(super) const OPTIONAL_V1: [&str; 2] = ["cpuacct", "freezer"];
/// Where the node's own processes go when its v2 cgroup has to be emptied (see `v2.rs`).
pub(super) const NODE_LEAF: &str = "node";

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Mount {
    /// The directory of the hierarchy this mount shows at its mount point.
    pub root: String,
    pub point: PathBuf,
    pub fstype: String,
    pub super_options: String,
}

/// The mounts in `mountinfo`; lines it cannot read are left out (they cannot be a cgroup
/// mount the node could use anyway).
pub(super) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_mount).collect()
}

fn parse_mount(line: &str) -> Option<Mount> {
    // id parent major:minor root point options [optional fields...] - fstype source super
    let (before, after) = line.split_once(" - ")?;
    let mut before = before.split(' ');
    let root = unescape(before.nth(3)?);
    let point = PathBuf::from(unescape(before.next()?));
    let mut after = after.split(' ');
    let fstype = after.next()?.to_owned();
    let super_options = after.nth(1).unwrap_or_default().to_owned();
    Some(Mount {
        root,
        point,
        fstype,
        super_options,
    })
}

/// A mountinfo path with its `\ooo` escapes undone.
fn unescape(field: &str) -> String {
    String::from_utf8_lossy(&crate::root::unescape(field.as_bytes())).into_owned()
}

/// One line of `/proc/self/cgroup`: the process's cgroup in one hierarchy.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Membership {
    /// Empty for the v2 hierarchy (`0::/path`).
    pub controllers: Vec<String>,
    pub path: String,
}

pub(super) fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let _id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            Some(Membership {
                controllers: controllers
                    .split(',')
                    .filter(|name| !name.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path: path.to_owned(),
            })
        })
        .collect()
}

/// The directory at which `mount` shows the cgroup `path`, if it shows it.
fn locate(mount: &Mount, path: &str) -> Option<PathBuf> {
    let rest = if mount.root == "/" {
        path.strip_prefix('/')?
    } else if path == mount.root {
        ""
    } else {
        path.strip_prefix(mount.root.as_str())?.strip_prefix('/')?
    };
    Some(if rest.is_empty() {
        mount.point.clone()
    } else {
        mount.point.join(rest)
    })
}

/// The hierarchy chosen, before anything is created in it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// The node's own v2 cgroup (its processes may be moved below it: see `v2.rs`).
    V2 { base: PathBuf },
    /// For each v1 hierarchy used (co-mounted controllers share one), the controllers used
    /// there and the node's own cgroup in it.
    V1 {
        hierarchies: Vec<(Vec<String>, PathBuf)>,
    },
}

/// Picks v2 when the node's cgroup there offers every required controller, else v1 when
/// each required controller has a hierarchy, else explains what is missing.
/// `v2_controllers` reads a v2 directory's `cgroup.controllers`.
pub(super) fn choose(
    mountinfo: &str,
    proc_cgroup: &str,
    group: &str,
    v2_controllers: impl Fn(&Path) -> Option<String>,
) -> Result<Layout, CgroupError> {
    let mounts = parse_mountinfo(mountinfo);
    let memberships = parse_proc_cgroup(proc_cgroup);
    let v2_missing = match choose_v2(&mounts, &memberships, group, v2_controllers) {
        Ok(base) => return Ok(Layout::V2 { base }),
        Err(missing) => missing,
    };
    let v1_missing = match choose_v1(&mounts, &memberships) {
        Ok(hierarchies) => return Ok(Layout::V1 { hierarchies }),
        Err(missing) => missing,
    };
    Err(CgroupError::Unavailable {
        v2: v2_missing,
        v1: v1_missing,
    })
}

fn choose_v2(
    mounts: &[Mount],
    memberships: &[Membership],
    group: &str,
    v2_controllers: impl Fn(&Path) -> Option<String>,
) -> Result<PathBuf, String> {
    let Some(own) = memberships.iter().find(|line| line.controllers.is_empty()) else {
        return Err("cgroup v2: the node is in no v2 cgroup".to_owned());
    };
    // A node whose processes were moved into `<group>/node` before (an earlier detection in
    // this process, or a child of such a node) keeps the same base.
    let leaf = format!("/{group}/{NODE_LEAF}");
    let path = match own.path.strip_suffix(leaf.as_str()) {
        Some("") => "/",
        Some(parent) => parent,
        None => own.path.as_str(),
    };
    let mut reasons = Vec::new();
    for mount in mounts.iter().filter(|mount| mount.fstype == "cgroup2") {
        let Some(base) = locate(mount, path) else {
            continue;
        };
        let Some(offered) = v2_controllers(&base) else {
            reasons.push(format!("cgroup v2: cannot read {}", base.display()));
            continue;
        };
        let offered: Vec<&str> = offered.split_whitespace().collect();
        let lacking: Vec<&str> = REQUIRED
            .into_iter()
            .filter(|name| !offered.contains(name))
            .collect();
        if lacking.is_empty() {
            return Ok(base);
        }
        reasons.push(format!(
            "cgroup v2 at {} lacks {}",
            base.display(),
            lacking.join(", ")
        ));
    }
    if reasons.is_empty() {
        reasons.push("cgroup v2: no cgroup2 mount shows the node's cgroup".to_owned());
    }
    Err(reasons.join("; "))
}

fn choose_v1(
    mounts: &[Mount],
    memberships: &[Membership],
) -> Result<Vec<(Vec<String>, PathBuf)>, String> {
    let mut hierarchies: Vec<(Vec<String>, PathBuf)> = Vec::new();
    let mut lacking = Vec::new();
    for controller in REQUIRED.into_iter().chain(OPTIONAL_V1) {
        let found = memberships
            .iter()
            .filter(|line| line.controllers.iter().any(|name| name == controller))
            .find_map(|line| {
                mounts
                    .iter()
                    .filter(|mount| {
                        mount.fstype == "cgroup"
                            && mount
                                .super_options
                                .split(',')
                                .any(|name| name == controller)
                    })
                    .find_map(|mount| locate(mount, &line.path))
            });
        match found {
            Some(dir) => match hierarchies.iter_mut().find(|(_, known)| *known == dir) {
                Some((controllers, _)) => controllers.push(controller.to_owned()),
                None => hierarchies.push((vec![controller.to_owned()], dir)),
            },
            None if REQUIRED.contains(&controller) => lacking.push(controller),
            None => {}
        }
    }
    if lacking.is_empty() {
        Ok(hierarchies)
    } else {
        Err(format!(
            "cgroup v1: no hierarchy for {}",
            lacking.join(", ")
        ))
    }
}

/// The memory limit over the node's own cgroups, in bytes: the least of the limits of its
/// cgroup and every ancestor that its mounts show, in the v2 hierarchy (`memory.max`) and in
/// a v1 memory hierarchy (`memory.limit_in_bytes`), both where a hybrid host has both.
/// `None` when none is limited (`max`, or v1's page-rounded `i64::MAX`), or none is mounted.
/// `read` reads one file of a cgroup directory.
pub(super) fn memory_limit(
    mountinfo: &str,
    proc_cgroup: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let mounts = parse_mountinfo(mountinfo);
    let mut least: Option<u64> = None;
    for line in parse_proc_cgroup(proc_cgroup) {
        let (fstype, file) = if line.controllers.is_empty() {
            ("cgroup2", "memory.max")
        } else if line.controllers.iter().any(|name| name == "memory") {
            ("cgroup", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let Some((point, dir)) = mounts
            .iter()
            .filter(|mount| {
                mount.fstype == fstype
                    && (fstype == "cgroup2"
                        || mount.super_options.split(',').any(|name| name == "memory"))
            })
            .find_map(|mount| Some((mount.point.clone(), locate(mount, &line.path)?)))
        else {
            continue;
        };
        // The node's group, then each ancestor up to the mount's root.
        for dir in dir.ancestors().take_while(|dir| dir.starts_with(&point)) {
            let limit = read(&dir.join(file))
                .and_then(|text| text.trim().parse::<u64>().ok())
                .filter(|&bytes| bytes < UNLIMITED_V1);
            if let Some(bytes) = limit {
                least = Some(least.map_or(bytes, |least| least.min(bytes)));
            }
        }
    }
    least
}

/// v1 says "no limit" with `i64::MAX` rounded down to a page; anything this large is none.
const UNLIMITED_V1: u64 = 1 << 62;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_limit_is_the_least_over_the_nodes_cgroup_and_its_ancestors_v1_and_v2() {
        let files = |entries: &'static [(&'static str, &'static str)]| {
            move |path: &Path| {
                entries
                    .iter()
                    .find(|(name, _)| Path::new(name) == path)
                    .map(|(_, text)| (*text).to_owned())
            }
        };
        // v1 (this machine's layout): the node's memory group is limited.
        assert_eq!(
            memory_limit(
                HYBRID,
                HYBRID_CGROUP,
                files(&[
                    (
                        "/sys/fs/cgroup/memory/process_api/1de3/memory.limit_in_bytes",
                        "4294967296\n"
                    ),
                    (
                        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                        "9223372036854771712\n"
                    ),
                ])
            ),
            Some(4 << 30)
        );
        // v1 without a limit anywhere: none.
        assert_eq!(
            memory_limit(
                HYBRID,
                HYBRID_CGROUP,
                files(&[(
                    "/sys/fs/cgroup/memory/process_api/1de3/memory.limit_in_bytes",
                    "9223372036854771712\n"
                )])
            ),
            None
        );
        // v2 in a container's namespace: the pod's limit, under a leaf the node moved into.
        let pod = "0::/node\n";
        assert_eq!(
            memory_limit(
                PURE_V2,
                pod,
                files(&[
                    ("/sys/fs/cgroup/node/memory.max", "max\n"),
                    ("/sys/fs/cgroup/memory.max", "2147483648\n"),
                ])
            ),
            Some(2 << 30)
        );
        assert_eq!(
            memory_limit(
                PURE_V2,
                pod,
                files(&[("/sys/fs/cgroup/node/memory.max", "max\n")])
            ),
            None
        );
        // A systemd unit on v1 with a v2 hierarchy beside: the least of both.
        assert_eq!(
            memory_limit(
                SYSTEMD_V1,
                SYSTEMD_V1_CGROUP,
                files(&[
                    (
                        "/sys/fs/cgroup/memory/system.slice/plinth-node.service/memory.limit_in_bytes",
                        "3221225472"
                    ),
                    (
                        "/sys/fs/cgroup/unified/system.slice/memory.max",
                        "1073741824"
                    ),
                ])
            ),
            Some(1 << 30)
        );
        // No cgroup mounts at all.
        assert_eq!(memory_limit("", HYBRID_CGROUP, |_| None), None);
    }

    /// This development machine: v1 controllers, and a v2 hierarchy with none of ours.
    const HYBRID: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/1de3
2:cpuacct:/
1:cpu:/
0::/
";

    /// A Kubernetes container on a pure v2 node, in its own cgroup namespace.
    const PURE_V2: &str = "\
1200 1180 0:120 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u
1210 1200 0:130 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate
";

    /// systemd's v1 layout: cpu and cpuacct mounted together, under a unit's cgroup.
    const SYSTEMD_V1: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:9 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:13 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid shared:14 - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/pids rw,nosuid shared:15 - cgroup cgroup rw,pids
";
    const SYSTEMD_V1_CGROUP: &str = "\
12:pids:/system.slice/plinth-node.service
5:memory:/system.slice/plinth-node.service
3:cpu,cpuacct:/system.slice/plinth-node.service
1:name=systemd:/system.slice/plinth-node.service
0::/system.slice/plinth-node.service
";

    fn offering(controllers: &'static str) -> impl Fn(&Path) -> Option<String> {
        move |_| Some(controllers.to_owned())
    }

    #[test]
    fn a_pure_v2_node_uses_its_own_cgroup_when_it_offers_memory_pids_and_cpu() {
        let layout = choose(
            PURE_V2,
            "0::/\n",
            "plinth",
            offering("cpuset cpu io memory hugetlb pids rdma misc\n"),
        )
        .expect("v2");
        assert_eq!(
            layout,
            Layout::V2 {
                base: PathBuf::from("/sys/fs/cgroup")
            }
        );
    }

    #[test]
    fn a_v2_node_under_a_systemd_unit_uses_the_units_cgroup() {
        let mountinfo = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let layout = choose(
            mountinfo,
            "0::/system.slice/plinth-node.service\n",
            "plinth",
            offering("cpu memory pids"),
        )
        .expect("v2");
        assert_eq!(
            layout,
            Layout::V2 {
                base: PathBuf::from("/sys/fs/cgroup/system.slice/plinth-node.service")
            }
        );
    }

    #[test]
    fn a_node_already_moved_into_its_leaf_finds_the_same_base_again() {
        for (own, base) in [
            ("0::/plinth/node\n", "/sys/fs/cgroup"),
            (
                "0::/kubepods/pod1/c1/plinth/node\n",
                "/sys/fs/cgroup/kubepods/pod1/c1",
            ),
        ] {
            let layout = choose(PURE_V2, own, "plinth", offering("cpu memory pids")).expect("v2");
            assert_eq!(
                layout,
                Layout::V2 {
                    base: PathBuf::from(base)
                }
            );
        }
    }

    #[test]
    fn a_hybrid_host_whose_v2_lacks_the_controllers_uses_v1_below_the_nodes_own_groups() {
        let layout = choose(HYBRID, HYBRID_CGROUP, "plinth", offering("hugetlb\n")).expect("v1");
        assert_eq!(
            layout,
            Layout::V1 {
                hierarchies: vec![
                    (
                        vec!["memory".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/memory/process_api/1de3")
                    ),
                    (
                        vec!["pids".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/pids")
                    ),
                    (vec!["cpu".to_owned()], PathBuf::from("/sys/fs/cgroup/cpu")),
                    (
                        vec!["cpuacct".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/cpuacct")
                    ),
                    (
                        vec!["freezer".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/freezer")
                    ),
                ]
            }
        );
    }

    #[test]
    fn a_hybrid_host_whose_v2_offers_the_controllers_uses_v2() {
        let layout =
            choose(HYBRID, HYBRID_CGROUP, "plinth", offering("cpu memory pids")).expect("v2");
        assert_eq!(
            layout,
            Layout::V2 {
                base: PathBuf::from("/sys/fs/cgroup/unified")
            }
        );
    }

    #[test]
    fn co_mounted_v1_controllers_share_one_hierarchy() {
        let layout = choose(SYSTEMD_V1, SYSTEMD_V1_CGROUP, "plinth", offering("")).expect("v1");
        let unit = "system.slice/plinth-node.service";
        assert_eq!(
            layout,
            Layout::V1 {
                hierarchies: vec![
                    (
                        vec!["memory".to_owned()],
                        Path::new("/sys/fs/cgroup/memory").join(unit)
                    ),
                    (
                        vec!["pids".to_owned()],
                        Path::new("/sys/fs/cgroup/pids").join(unit)
                    ),
                    (
                        vec!["cpu".to_owned(), "cpuacct".to_owned()],
                        Path::new("/sys/fs/cgroup/cpu,cpuacct").join(unit)
                    ),
                ]
            }
        );
    }

    #[test]
    fn a_mount_of_a_subtree_shows_the_nodes_cgroup_at_its_mount_point() {
        let mountinfo = "\
40 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory
41 31 0:36 /docker/abc /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids
42 31 0:29 /docker/abc /sys/fs/cgroup/cpu\\040acct ro - cgroup cgroup rw,cpu,cpuacct
";
        let cgroup = "4:memory:/docker/abc\n8:pids:/docker/abc/sub\n1:cpu,cpuacct:/docker/abc\n";
        let layout = choose(mountinfo, cgroup, "plinth", offering("")).expect("v1");
        assert_eq!(
            layout,
            Layout::V1 {
                hierarchies: vec![
                    (
                        vec!["memory".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/memory")
                    ),
                    (
                        vec!["pids".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/pids/sub")
                    ),
                    (
                        vec!["cpu".to_owned(), "cpuacct".to_owned()],
                        PathBuf::from("/sys/fs/cgroup/cpu acct")
                    ),
                ]
            }
        );
    }

    #[test]
    fn without_any_usable_hierarchy_the_error_names_what_is_missing_and_what_to_do() {
        let mountinfo = "\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";
        let error = choose(
            mountinfo,
            "4:memory:/\n0::/\n",
            "plinth",
            offering("hugetlb"),
        )
        .expect_err("nothing usable");
        let message = error.to_string();
        assert!(
            message.contains("lacks memory, pids, cpu"),
            "v2's shortfall: {message}"
        );
        assert!(
            message.contains("no hierarchy for pids, cpu"),
            "v1's shortfall: {message}"
        );
        assert!(message.contains("mount cgroup2"), "the remedy: {message}");
    }

    #[test]
    fn a_host_without_cgroup_mounts_is_told_to_mount_cgroup2() {
        let error = choose(
            "22 1 0:21 / /proc rw - proc proc rw\n",
            "0::/\n",
            "plinth",
            offering(""),
        )
        .expect_err("no cgroups");
        let message = error.to_string();
        assert!(message.contains("no cgroup2 mount"), "{message}");
        assert!(message.contains("mount cgroup2"), "{message}");
    }
}
