//! The operators' kit stays in step with the metrics Plinth exports: every metric the Grafana
//! dashboards (`deploy/grafana/*.json`) and the alerting rules (`deploy/prometheus/`) query is
//! in the metrics table (`docs/operating/telemetry.md`), every alert has a runbook line in
//! the alerts runbook (`docs/operating/alerts.md`, which each rule's `runbook_url` names), and the
//! `PrometheusRule` carries the same rules as the plain rules file.
//!
//! And it deploys what runs: the Kustomize overlays (`deploy/kubernetes/overlays/*`), rendered
//! by `kubectl kustomize` as `kubectl apply -k` would, run every service (a builder too) with
//! the privileges, limits, probes, disruption budgets and network policies it needs; the
//! images (`deploy/Dockerfile`) carry what builds and sessions run; compose runs the same.
//! In both, a node's session capacity (`PLINTH_NODE_MAX_SESSIONS`) is what its memory limit
//! holds at the default session memory beside its reserve, a node pod leaves the catalog
//! before it stops (`plinth node --drain`), and the database pools of every replica, during a
//! rolling update too, fit PostgreSQL's default 100 connections with room to spare.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

const TABLE_START: &str = "<!-- metrics-table:start -->";
const TABLE_END: &str = "<!-- metrics-table:end -->";
const RULES: &str = "deploy/prometheus/alerts.yml";
const PROMETHEUS_RULE: &str = "deploy/prometheus/prometheusrule.yaml";
/// The page of the metrics table.
const TELEMETRY: &str = "docs/operating/telemetry.md";
/// The alerts runbook, which every rule's `runbook_url` names (from the repository's root).
const RUNBOOK_URL: &str = "docs/operating/alerts.md";
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// The metrics table (between the markers in [`TELEMETRY`]): metric name → type.
pub(crate) fn metrics_table() -> BTreeMap<String, Kind> {
    let readme = read(TELEMETRY);
    let start = readme
        .find(TABLE_START)
        .unwrap_or_else(|| panic!("{TELEMETRY}: no `{TABLE_START}` line"))
        + TABLE_START.len();
    let end = readme[start..]
        .find(TABLE_END)
        .unwrap_or_else(|| panic!("{TELEMETRY}: no `{TABLE_END}` line after `{TABLE_START}`"))
        + start;
    let mut table = BTreeMap::new();
    for line in readme[start..end].lines().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        let row = line
            .strip_prefix('|')
            .and_then(|rest| rest.strip_suffix('|'))
            .unwrap_or_else(|| {
                panic!(
                    "{TELEMETRY} metrics table: a line between the markers is not a table row: {line}"
                )
            });
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let header = cells.first().is_some_and(|cell| *cell == "Metric");
        let separator = cells
            .iter()
            .all(|cell| !cell.is_empty() && cell.chars().all(|c| c == '-' || c == ':'));
        if header || separator {
            continue;
        }
        assert!(
            cells.len() == 5,
            "{TELEMETRY} metrics table: a row has {} columns, not 5 (metric, type, labels, \
             exported by, meaning): {line}",
            cells.len()
        );
        let name = cells[0]
            .strip_prefix('`')
            .and_then(|cell| cell.strip_suffix('`'))
            .unwrap_or_else(|| {
                panic!(
                    "{TELEMETRY} metrics table: the first column is not a name in backticks: {line}"
                )
            });
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{TELEMETRY} metrics table: `{name}` is not a metric name ([a-z0-9_]+)"
        );
        let kind = match cells[1].split_whitespace().next() {
            Some("counter") => Kind::Counter,
            Some("gauge") => Kind::Gauge,
            Some("histogram") => Kind::Histogram,
            _ => panic!(
                "{TELEMETRY} metrics table: `{name}` has type `{}`, not counter, gauge or histogram",
                cells[1]
            ),
        };
        if kind == Kind::Counter {
            assert!(
                name.ends_with("_total"),
                "{TELEMETRY} metrics table: the counter `{name}` does not end in `_total`"
            );
        }
        assert!(
            table.insert(name.to_owned(), kind).is_none(),
            "{TELEMETRY} metrics table: `{name}` is listed twice"
        );
    }
    assert!(
        !table.is_empty(),
        "{TELEMETRY}: the metrics table between `{TABLE_START}` and `{TABLE_END}` has no rows"
    );
    table
}

/// The metric identifiers an expression names: whole words starting `plinth_` or `process_`.
fn metric_names(expr: &str) -> Vec<&str> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    expr.split(|c: char| !word(c))
        .filter(|token| {
            ["plinth_", "process_"]
                .iter()
                .any(|prefix| token.len() > prefix.len() && token.starts_with(prefix))
        })
        .collect()
}

/// What is wrong with the metrics of `expr` (found at `place`): names not in the table, and
/// `_bucket`/`_sum`/`_count` series of metrics that are not histograms.
fn unlisted_metrics(table: &BTreeMap<String, Kind>, place: &str, expr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for name in metric_names(expr) {
        if table.contains_key(name) {
            continue;
        }
        let histogram_series = HISTOGRAM_SUFFIXES.iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| table.get(base) == Some(&Kind::Histogram))
        });
        if !histogram_series {
            problems.push(format!(
                "{place}: `{name}` is not in {TELEMETRY}'s metrics table (nor a `_bucket`, `_sum` \
                 or `_count` series of a histogram listed there); expr: {expr}"
            ));
        }
    }
    problems
}

/// Every `expr` under `value`, with the title of the nearest enclosing panel.
fn panel_exprs(value: &Value, title: &str, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) => {
            let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
            for (key, child) in map {
                if key == "expr" {
                    out.push((title.to_owned(), child.clone()));
                } else {
                    panel_exprs(child, title, out);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                panel_exprs(item, title, out);
            }
        }
        _ => {}
    }
}

/// Panels other than rows, nested ones included.
fn panel_count(panels: &[Value]) -> usize {
    panels
        .iter()
        .map(|panel| {
            let nested = panel
                .get("panels")
                .and_then(Value::as_array)
                .map_or(0, |nested| panel_count(nested));
            let own = usize::from(panel.get("type").and_then(Value::as_str) != Some("row"));
            own + nested
        })
        .sum()
}

#[test]
fn the_metrics_table_lists_the_exported_metrics() {
    let table = metrics_table();
    for name in [
        "plinth_build_info",
        "plinth_http_requests_total",
        "plinth_grpc_server_requests_total",
        "process_cpu_seconds_total",
    ] {
        assert!(
            table.contains_key(name),
            "{TELEMETRY} metrics table: `{name}` is missing"
        );
    }
}

#[test]
fn dashboards_query_only_listed_metrics() {
    let table = metrics_table();
    let dir = root().join("deploy/grafana");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .path()
        })
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let names: BTreeSet<String> = files
        .iter()
        .filter_map(|path| path.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    assert!(
        names.contains("plinth-overview.json"),
        "deploy/grafana/plinth-overview.json is missing (dashboards there: {names:?})"
    );

    let mut problems = Vec::new();
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    for path in &files {
        let file = format!(
            "deploy/grafana/{}",
            path.file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        let text = read(&file);
        let dashboard: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file} is not valid JSON: {e}"));

        match dashboard.get("uid").and_then(Value::as_str) {
            Some(uid) if !uid.is_empty() => {
                if let Some(other) = uids.insert(uid.to_owned(), file.clone()) {
                    problems.push(format!("{file}: uid `{uid}` is also the uid of {other}"));
                }
            }
            _ => problems.push(format!("{file}: no `uid`")),
        }

        let panels = dashboard
            .get("panels")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if panel_count(panels) == 0 {
            problems.push(format!("{file}: no panels"));
        }

        let mut exprs = Vec::new();
        for panel in panels {
            panel_exprs(panel, "(untitled panel)", &mut exprs);
        }
        if exprs.is_empty() {
            problems.push(format!("{file}: no panel has an `expr`"));
        }
        for (title, expr) in &exprs {
            let place = format!("{file}, panel \"{title}\"");
            match expr.as_str() {
                Some(expr) if !expr.trim().is_empty() => {
                    problems.extend(unlisted_metrics(&table, &place, expr));
                }
                _ => problems.push(format!("{place}: `expr` is empty or not a string: {expr}")),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the Grafana dashboards:\n{}",
        problems.join("\n")
    );
}

/// One alerting rule as read from a rules file, line by line.
#[derive(Debug, Default)]
struct Alert {
    name: String,
    line: usize,
    expr: Option<String>,
    duration: Option<String>,
    severity: Option<String>,
    summary: Option<String>,
    runbook_url: Option<String>,
}

fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|rest| rest.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

/// The alerting rules of a Prometheus rules file (plain, or inside a `PrometheusRule`), in
/// order. Each key applies to the latest `alert:` above it; a group or recording rule ends it.
fn alerts(file: &str) -> Vec<Alert> {
    let text = read(file);
    let mut alerts: Vec<Alert> = Vec::new();
    let mut current: Option<usize> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("- ").unwrap_or(line).trim_start();
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = unquote(value.trim()).to_owned();
        match key {
            "alert" => {
                alerts.push(Alert {
                    name: value,
                    line: index + 1,
                    ..Alert::default()
                });
                current = Some(alerts.len() - 1);
            }
            "record" | "name" | "groups" => current = None,
            _ => {
                let Some(alert) = current.and_then(|i| alerts.get_mut(i)) else {
                    continue;
                };
                let field = match key {
                    "expr" => &mut alert.expr,
                    "for" => &mut alert.duration,
                    "severity" => &mut alert.severity,
                    "summary" => &mut alert.summary,
                    "runbook_url" => &mut alert.runbook_url,
                    _ => continue,
                };
                *field = Some(value);
            }
        }
    }
    alerts
}

/// The alerts runbook, the page every rule's `runbook_url` names.
fn alerts_runbook() -> String {
    let runbook = read(RUNBOOK_URL);
    assert!(
        runbook.starts_with("# Alerts\n"),
        "{RUNBOOK_URL}: not the alerts runbook (its first line is not `# Alerts`)"
    );
    runbook
}

#[test]
fn alert_rules_query_only_listed_metrics_and_have_runbooks() {
    let table = metrics_table();
    let rules = alerts(RULES);
    assert!(
        rules.len() >= 8,
        "{RULES}: {} alerts, expected at least 8",
        rules.len()
    );
    let runbooks = alerts_runbook();
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for alert in &rules {
        let place = format!("{RULES}:{}, alert {}", alert.line, alert.name);
        if !names.insert(alert.name.as_str()) {
            problems.push(format!("{place}: the name is used twice"));
        }
        match alert.expr.as_deref() {
            None => problems.push(format!("{place}: no `expr`")),
            Some(expr) if expr.is_empty() || expr.starts_with('|') || expr.starts_with('>') => {
                problems.push(format!("{place}: `expr` is not on one line"));
            }
            Some(expr) => problems.extend(unlisted_metrics(&table, &place, expr)),
        }
        if alert.duration.as_deref().is_none_or(str::is_empty) {
            problems.push(format!("{place}: no `for`"));
        }
        if alert.severity.as_deref().is_none_or(str::is_empty) {
            problems.push(format!("{place}: no `labels.severity`"));
        }
        if alert.summary.as_deref().is_none_or(str::is_empty) {
            problems.push(format!("{place}: no `annotations.summary`"));
        }
        match alert.runbook_url.as_deref() {
            Some(RUNBOOK_URL) => {}
            Some(other) => problems.push(format!(
                "{place}: `runbook_url` is {other}, expected {RUNBOOK_URL}"
            )),
            None => problems.push(format!("{place}: no `annotations.runbook_url`")),
        }
        if !runbooks.contains(&format!("**{}**", alert.name)) {
            problems.push(format!(
                "{place}: no runbook line with **{}** in {RUNBOOK_URL}",
                alert.name
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the alerting rules:\n{}",
        problems.join("\n")
    );
}

#[test]
fn prometheus_rule_matches_plain_rules() {
    let text = read(PROMETHEUS_RULE);
    for line in [
        "apiVersion: monitoring.coreos.com/v1",
        "kind: PrometheusRule",
    ] {
        assert!(
            text.lines().any(|l| l.trim_end() == line),
            "{PROMETHEUS_RULE}: no `{line}` line"
        );
    }
    let key = |alert: &Alert| {
        (
            alert.name.clone(),
            alert.expr.clone().unwrap_or_default(),
            alert.duration.clone().unwrap_or_default(),
        )
    };
    let plain: Vec<_> = alerts(RULES).iter().map(key).collect();
    let operator: Vec<_> = alerts(PROMETHEUS_RULE).iter().map(key).collect();
    assert!(!plain.is_empty(), "{RULES}: no alerts");
    for (index, (a, b)) in plain.iter().zip(&operator).enumerate() {
        assert_eq!(
            a,
            b,
            "alert {} ({}) differs between {RULES} and {PROMETHEUS_RULE} (name, expr, for)",
            index + 1,
            a.0
        );
    }
    assert_eq!(
        plain.len(),
        operator.len(),
        "{RULES} has {} alerts, {PROMETHEUS_RULE} has {}",
        plain.len(),
        operator.len()
    );
}

const OVERLAYS: [&str; 2] = [
    "deploy/kubernetes/overlays/dev",
    "deploy/kubernetes/overlays/prod",
];
const DOCKERFILE: &str = "deploy/Dockerfile";
/// The Deployments a split Plinth needs, each with a disruption budget; nodes are a DaemonSet.
const DEPLOYMENTS: [&str; 4] = [
    "plinth-catalog",
    "plinth-source",
    "plinth-gateway",
    "plinth-builder",
];
/// The private, link-local and metadata ranges sessions' and builds' traffic must not reach.
const PRIVATE_V4: [&str; 4] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
];
const PRIVATE_V6: [&str; 2] = ["fc00::/7", "fe80::/10"];

/// Every document of a YAML stream, as JSON values (merge keys applied).
fn yaml_documents(place: &str, text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|document| {
            let mut value = serde_yaml::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{place} is not valid YAML: {e}"));
            value
                .apply_merge()
                .unwrap_or_else(|e| panic!("{place}: a YAML merge key cannot be applied: {e}"));
            serde_json::to_value(value)
                .unwrap_or_else(|e| panic!("{place}: a document has no JSON equivalent: {e}"))
        })
        .filter(|value| !value.is_null())
        .collect()
}

/// The overlay's resources as `kubectl apply -k` would send them; `None` (the test skips)
/// where kubectl is missing, except under CI, where that fails the test.
fn kustomize(overlay: &str) -> Option<Vec<Value>> {
    let output = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join(overlay))
        .output()
    {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "kubectl is not on PATH: CI renders the Kustomize overlays with `kubectl \
                 kustomize`; install kubectl"
            );
            eprintln!("kubectl is not on PATH: skipping the Kubernetes manifests' checks");
            return None;
        }
        Err(error) => panic!("cannot run kubectl kustomize {overlay}: {error}"),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {overlay} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)
        .unwrap_or_else(|e| panic!("kubectl kustomize {overlay} printed no UTF-8: {e}"));
    Some(yaml_documents(
        &format!("kubectl kustomize {overlay}"),
        &text,
    ))
}

fn kind_name(resource: &Value) -> (&str, &str) {
    (
        resource["kind"].as_str().unwrap_or_default(),
        resource["metadata"]["name"].as_str().unwrap_or_default(),
    )
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects `labels`. An empty
/// selector selects everything, as Kubernetes reads it.
fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |key: &str| labels[key].as_str();
    let by_labels = selector["matchLabels"].as_object().is_none_or(|wanted| {
        wanted
            .iter()
            .all(|(key, value)| label(key) == value.as_str())
    });
    let by_expressions = array(&selector["matchExpressions"])
        .iter()
        .all(|expression| {
            let key = expression["key"].as_str().unwrap_or_default();
            let values: Vec<&str> = array(&expression["values"])
                .iter()
                .filter_map(Value::as_str)
                .collect();
            match expression["operator"].as_str() {
                Some("In") => label(key).is_some_and(|value| values.contains(&value)),
                Some("NotIn") => label(key).is_none_or(|value| !values.contains(&value)),
                Some("Exists") => label(key).is_some(),
                Some("DoesNotExist") => label(key).is_none(),
                _ => false,
            }
        });
    by_labels && by_expressions
}

/// A container's effective `securityContext` field: its own, else its pod's.
fn security<'a>(pod: &'a Value, container: &'a Value, field: &str) -> &'a Value {
    match &container["securityContext"][field] {
        Value::Null => &pod["securityContext"][field],
        own => own,
    }
}

/// The value following `flag` in a container's arguments.
fn flag<'a>(container: &'a Value, flag: &str) -> Option<&'a str> {
    let args: Vec<&str> = array(&container["args"])
        .iter()
        .chain(array(&container["command"]))
        .filter_map(Value::as_str)
        .collect();
    args.iter()
        .position(|arg| *arg == flag)
        .and_then(|index| args.get(index + 1))
        .copied()
}

/// The host of each URL in a `--catalog-url`/`--source-url` value (one URL or a comma-separated
/// list).
fn url_hosts(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(|url| {
            let rest = url.trim().split_once("://").map_or(url, |(_, rest)| rest);
            rest.split(['/', ':']).next().unwrap_or_default()
        })
        .collect()
}

/// What is wrong with one rendered overlay's workloads, services, budgets and policies.
fn manifest_problems(overlay: &str, resources: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let find = |kind: &str, name: &str| {
        resources
            .iter()
            .find(|resource| kind_name(resource) == (kind, name))
    };
    let workloads: Vec<&Value> = resources
        .iter()
        .filter(|resource| {
            matches!(
                kind_name(resource).0,
                "Deployment" | "DaemonSet" | "StatefulSet"
            )
        })
        .collect();

    for name in DEPLOYMENTS {
        if find("Deployment", name).is_none() {
            problems.push(format!("{overlay}: no Deployment {name}"));
        }
    }
    match find("Deployment", "plinth-builder") {
        Some(builder) => {
            let runs_builder = array(&builder["spec"]["template"]["spec"]["containers"])
                .iter()
                .any(|c| array(&c["args"]).first().and_then(Value::as_str) == Some("builder"));
            if !runs_builder {
                problems.push(format!(
                    "{overlay}: Deployment plinth-builder runs no `plinth builder`: builds \
                     would stay queued"
                ));
            }
        }
        None => problems.push(format!(
            "{overlay}: no builder workload: builds would stay queued forever"
        )),
    }

    // Builder and node build sandboxes: root, privileged (the processes refuse to start
    // otherwise, and namespaces, mounts and cgroups need it).
    for (kind, name) in [
        ("DaemonSet", "plinth-node"),
        ("Deployment", "plinth-builder"),
    ] {
        let Some(workload) = find(kind, name) else {
            problems.push(format!("{overlay}: no {kind} {name}"));
            continue;
        };
        let pod = &workload["spec"]["template"]["spec"];
        for container in array(&pod["containers"]) {
            let place = format!(
                "{overlay}: {kind} {name}, container {}",
                container["name"].as_str().unwrap_or("(unnamed)")
            );
            if security(pod, container, "runAsUser").as_i64() != Some(0) {
                problems.push(format!(
                    "{place}: not `runAsUser: 0` (the image's user may not be root, and the \
                     process refuses to start unless it is)"
                ));
            }
            if security(pod, container, "privileged").as_bool() != Some(true) {
                problems.push(format!(
                    "{place}: not privileged (sandboxes need namespaces, mounts, loop devices \
                     and a writable cgroup tree)"
                ));
            }
        }
    }

    if let Some(node) = find("DaemonSet", "plinth-node") {
        let pod = &node["spec"]["template"]["spec"];
        if pod["hostPID"].as_bool() == Some(true) {
            problems.push(format!(
                "{overlay}: the node DaemonSet shares the host's PID namespace"
            ));
        }
        for container in array(&pod["containers"]) {
            let advertised = flag(container, "--advertise-url").is_some_and(|url| {
                url.contains("$(POD_IP)")
                    && array(&container["env"]).iter().any(|env| {
                        env["name"] == "POD_IP"
                            && env["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
                    })
            });
            if !advertised {
                problems.push(format!(
                    "{overlay}: the node does not advertise its pod's address \
                     (`--advertise-url http://$(POD_IP):7005`, POD_IP from status.podIP)"
                ));
            }
        }
    }

    for workload in &workloads {
        let (kind, name) = kind_name(workload);
        let pod = &workload["spec"]["template"]["spec"];
        for container in array(&pod["containers"])
            .iter()
            .chain(array(&pod["initContainers"]))
        {
            let place = format!(
                "{overlay}: {kind} {name}, container {}",
                container["name"].as_str().unwrap_or("(unnamed)")
            );
            for bound in ["requests", "limits"] {
                for resource in ["cpu", "memory"] {
                    if container["resources"][bound][resource].is_null() {
                        problems.push(format!("{place}: no resources.{bound}.{resource}"));
                    }
                }
            }
            if array(&pod["initContainers"]).contains(container) {
                continue;
            }
            let ports: Vec<&Value> = array(&container["ports"])
                .iter()
                .flat_map(|port| [&port["name"], &port["containerPort"]])
                .collect();
            for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
                let get = &container[probe]["httpGet"];
                if get["path"] != path {
                    problems.push(format!(
                        "{place}: {probe} is not an HTTP GET of {path} (found {})",
                        container[probe]
                    ));
                } else if !ports.contains(&&get["port"]) {
                    problems.push(format!(
                        "{place}: {probe} probes port {}, which the container does not declare",
                        get["port"]
                    ));
                }
                // Kubernetes' default is a 1 s timeout and 3 misses; say so, and keep each
                // probe's timeout inside its period so probes never pile up.
                let number = |key: &str| container[probe][key].as_u64();
                match (
                    number("timeoutSeconds"),
                    number("periodSeconds"),
                    number("failureThreshold"),
                ) {
                    (Some(timeout), Some(period), Some(misses))
                        if timeout < period && misses >= 2 => {}
                    _ => problems.push(format!(
                        "{place}: {probe} must set timeoutSeconds (below periodSeconds), \
                         periodSeconds and failureThreshold (2 or more): {}",
                        container[probe]
                    )),
                }
            }
            // Clients balance across replicas themselves: they need every replica's address,
            // which only a headless Service's name resolves to.
            for (url_flag, headless) in [
                ("--catalog-url", "plinth-catalog-headless"),
                ("--source-url", "plinth-source-headless"),
            ] {
                if let Some(value) = flag(container, url_flag) {
                    let hosts = url_hosts(value);
                    if hosts.iter().any(|host| *host != headless) {
                        problems.push(format!(
                            "{place}: {url_flag} {value} does not name the headless Service \
                             {headless}"
                        ));
                    }
                }
            }
        }
    }
    for (name, command) in [
        ("plinth-source", "source"),
        ("plinth-gateway", "gateway"),
        ("plinth-builder", "builder"),
    ] {
        let calls_catalog = find("Deployment", name).is_some_and(|workload| {
            array(&workload["spec"]["template"]["spec"]["containers"])
                .iter()
                .any(|c| flag(c, "--catalog-url").is_some())
        });
        if !calls_catalog {
            problems.push(format!(
                "{overlay}: `plinth {command}` ({name}) is given no --catalog-url"
            ));
        }
    }
    if let Some(node) = find("DaemonSet", "plinth-node")
        && !array(&node["spec"]["template"]["spec"]["containers"])
            .iter()
            .any(|c| flag(c, "--catalog-url").is_some())
    {
        problems.push(format!(
            "{overlay}: `plinth node` is given no --catalog-url"
        ));
    }
    for (headless, app, port) in [
        ("plinth-catalog-headless", "plinth-catalog", 7001),
        ("plinth-source-headless", "plinth-source", 7003),
    ] {
        let ok = find("Service", headless).is_some_and(|service| {
            service["spec"]["clusterIP"] == "None"
                && service["spec"]["selector"]["app"] == app
                && array(&service["spec"]["ports"])
                    .iter()
                    .any(|p| p["port"] == port)
        });
        if !ok {
            problems.push(format!(
                "{overlay}: no headless Service {headless} (clusterIP: None, selecting \
                 app={app}, port {port})"
            ));
        }
    }

    let budgets: Vec<&Value> = resources
        .iter()
        .filter(|resource| kind_name(resource).0 == "PodDisruptionBudget")
        .collect();
    for name in DEPLOYMENTS {
        let Some(deployment) = find("Deployment", name) else {
            continue;
        };
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        if !budgets
            .iter()
            .any(|budget| selects(&budget["spec"]["selector"], labels))
        {
            problems.push(format!(
                "{overlay}: no PodDisruptionBudget selects Deployment {name}'s pods"
            ));
        }
    }

    problems.extend(sandbox_egress_problems(overlay, resources));
    problems.extend(capacity_manifest_problems(overlay, resources));
    problems
}

/// PostgreSQL's default `max_connections`, which the manifests' pools must fit.
const POSTGRES_MAX_CONNECTIONS: u64 = 100;
/// Connections left out of the services' pools: PostgreSQL's own reserve for superusers (3),
/// `plinth gc` run by hand, an operator's psql, a migration.
const SPARE_CONNECTIONS: u64 = 20;

/// A container's environment variable, as a literal value.
fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    array(&container["env"])
        .iter()
        .find(|env| env["name"] == name)
        .and_then(|env| env["value"].as_str())
}

/// A memory amount in MiB: a Kubernetes quantity (`4Gi`, `512Mi`, `4G`) or compose's
/// `mem_limit` (`4608m`, `4g`).
fn memory_mib(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let bytes = match unit {
        "" | "b" => number,
        "Ki" | "k" | "kb" => number * 1024,
        "Mi" | "m" | "mb" => number * 1024 * 1024,
        "Gi" | "g" | "gb" => number * 1024 * 1024 * 1024,
        "K" => number * 1000,
        "M" => number * 1000 * 1000,
        "G" => number * 1000 * 1000 * 1000,
        _ => return None,
    };
    Some(bytes / (1024 * 1024))
}

/// What is wrong with a node's capacity against its memory limit: the node offers sessions
/// its limit less its reserve, and `max_sessions` must be what that holds at the default
/// session memory, no more (sessions the memory cannot hold) and no fewer (memory no
/// session can use).
fn node_capacity_problems(
    place: &str,
    max_sessions: Option<&str>,
    reserve: Option<&str>,
    limit: Option<&str>,
) -> Vec<String> {
    let session_mb = plinth::config::SessionsSection::default().memory_mb;
    let Some(max_sessions) = max_sessions.and_then(|text| text.parse::<u64>().ok()) else {
        return vec![format!(
            "{place}: PLINTH_NODE_MAX_SESSIONS is not set to a number: the node would take \
             sessions until its memory is committed, with no bound an operator chose"
        )];
    };
    let reserve = match reserve {
        Some(text) => match text.parse::<u64>() {
            Ok(reserve) => reserve,
            Err(_) => return vec![format!("{place}: PLINTH_NODE_MEMORY_RESERVE_MB {text:?}")],
        },
        None => plinth::config::NodeSection::default().memory_reserve_mb,
    };
    let Some(limit) = limit.and_then(memory_mib) else {
        return vec![format!(
            "{place}: no memory limit the node's capacity can follow"
        )];
    };
    let wanted = max_sessions * session_mb + reserve;
    if wanted > limit {
        vec![format!(
            "{place}: {max_sessions} sessions × {session_mb} MiB + {reserve} MiB reserve is \
             {wanted} MiB, more than the {limit} MiB memory limit: lower \
             PLINTH_NODE_MAX_SESSIONS or raise the limit"
        )]
    } else if limit - wanted >= session_mb {
        vec![format!(
            "{place}: the {limit} MiB memory limit holds more than {max_sessions} sessions of \
             {session_mb} MiB beside the {reserve} MiB reserve: raise \
             PLINTH_NODE_MAX_SESSIONS to {} or lower the limit to {wanted} MiB",
            (limit - reserve) / session_mb
        )]
    } else {
        Vec::new()
    }
}

/// Connections one process's pools open at most: `pool` and, for the catalog, the one that
/// listens for queued builds.
fn connections(pool: u64, listens: bool) -> u64 {
    pool + u64::from(listens)
}

/// What is wrong with an overlay's node capacity and database pools.
fn capacity_manifest_problems(overlay: &str, resources: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let find = |kind: &str, name: &str| {
        resources
            .iter()
            .find(|resource| kind_name(resource) == (kind, name))
    };
    if let Some(node) = find("DaemonSet", "plinth-node") {
        for container in array(&node["spec"]["template"]["spec"]["containers"]) {
            let place = format!(
                "{overlay}: DaemonSet plinth-node, container {}",
                container["name"].as_str().unwrap_or("(unnamed)")
            );
            problems.extend(node_capacity_problems(
                &place,
                env_value(container, "PLINTH_NODE_MAX_SESSIONS"),
                env_value(container, "PLINTH_NODE_MEMORY_RESERVE_MB"),
                container["resources"]["limits"]["memory"].as_str(),
            ));
            let stop: Vec<&str> = array(&container["lifecycle"]["preStop"]["exec"]["command"])
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let drains = stop.windows(2).any(|pair| pair == ["node", "--drain"])
                && stop.windows(2).any(|pair| {
                    pair[0] == "--catalog-url" && Some(pair[1]) == flag(container, "--catalog-url")
                });
            if !drains {
                problems.push(format!(
                    "{place}: no preStop `plinth node --drain` with the node's --catalog-url: a \
                     pod stopped on purpose would be reported late (PlinthNodeHeartbeatsLate) \
                     and given sessions until its heartbeats run out"
                ));
            }
        }
    }
    let mut total = 0;
    let mut shares = Vec::new();
    for (name, variable, listens) in [
        ("plinth-catalog", "PLINTH_DATABASE_MAX_CONNECTIONS", true),
        (
            "plinth-source",
            "PLINTH_SOURCE_DATABASE_MAX_CONNECTIONS",
            false,
        ),
    ] {
        let Some(deployment) = find("Deployment", name) else {
            continue;
        };
        let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
        // A rolling update runs maxSurge more pods (25% of the replicas, rounded up, unless
        // the Deployment says).
        let surge = match &deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] {
            Value::Number(number) => number.as_u64().unwrap_or(0),
            Value::String(percent) => percent
                .trim_end_matches('%')
                .parse::<u64>()
                .map_or(0, |percent| (replicas * percent).div_ceil(100)),
            _ => replicas.div_ceil(4),
        };
        for container in array(&deployment["spec"]["template"]["spec"]["containers"]) {
            let Some(pool) =
                env_value(container, variable).and_then(|text| text.parse::<u64>().ok())
            else {
                problems.push(format!(
                    "{overlay}: Deployment {name} does not set {variable}: each replica's pool \
                     is then the default, whatever the replicas add up to"
                ));
                continue;
            };
            let at_most = (replicas + surge) * connections(pool, listens);
            total += at_most;
            shares.push(format!(
                "{name}: ({replicas} + {surge} surging) × {}",
                connections(pool, listens)
            ));
        }
    }
    if total > POSTGRES_MAX_CONNECTIONS - SPARE_CONNECTIONS {
        problems.push(format!(
            "{overlay}: the database pools add up to {total} connections ({}), past the {} of \
             PostgreSQL's {POSTGRES_MAX_CONNECTIONS} left once {SPARE_CONNECTIONS} are kept \
             spare: lower the pools or raise max_connections",
            shares.join(", "),
            POSTGRES_MAX_CONNECTIONS - SPARE_CONNECTIONS
        ));
    }
    problems
}

/// What is wrong with the egress of the pods that run tenants' code (builder, node): each must
/// be selected by an egress policy, and no policy may let them reach private, link-local or
/// metadata addresses, or whole namespaces beyond DNS.
fn sandbox_egress_problems(overlay: &str, resources: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let policies: Vec<&Value> = resources
        .iter()
        .filter(|resource| kind_name(resource).0 == "NetworkPolicy")
        .collect();
    for (kind, name) in [
        ("Deployment", "plinth-builder"),
        ("DaemonSet", "plinth-node"),
    ] {
        let Some(workload) = resources
            .iter()
            .find(|resource| kind_name(resource) == (kind, name))
        else {
            continue;
        };
        let labels = &workload["spec"]["template"]["metadata"]["labels"];
        let egress: Vec<&Value> = policies
            .iter()
            .copied()
            .filter(|policy| {
                selects(&policy["spec"]["podSelector"], labels)
                    && array(&policy["spec"]["policyTypes"])
                        .iter()
                        .any(|t| t == "Egress")
            })
            .collect();
        if egress.is_empty() {
            problems.push(format!(
                "{overlay}: no NetworkPolicy limits {name}'s egress: sessions and builds could \
                 reach the cluster's services"
            ));
        }
        for policy in egress {
            let place = format!(
                "{overlay}: NetworkPolicy {} (egress of {name})",
                kind_name(policy).1
            );
            for rule in array(&policy["spec"]["egress"]) {
                let peers = array(&rule["to"]);
                if peers.is_empty() {
                    problems.push(format!("{place}: a rule with no `to` allows everywhere"));
                }
                for peer in peers {
                    if let Some(cidr) = peer["ipBlock"]["cidr"].as_str() {
                        let except: Vec<&str> = array(&peer["ipBlock"]["except"])
                            .iter()
                            .filter_map(Value::as_str)
                            .collect();
                        let needed: &[&str] = match cidr {
                            "0.0.0.0/0" => &PRIVATE_V4,
                            "::/0" => &PRIVATE_V6,
                            _ => &[],
                        };
                        for range in needed {
                            if !except.contains(range) {
                                problems.push(format!(
                                    "{place}: ipBlock {cidr} does not except {range}"
                                ));
                            }
                        }
                        if needed.is_empty() {
                            problems.push(format!(
                                "{place}: ipBlock {cidr}: allow the internet as 0.0.0.0/0 or \
                                 ::/0 with the private ranges excepted, or name pods"
                            ));
                        }
                    } else if !peer["namespaceSelector"].is_null() {
                        let dns_only = !array(&rule["ports"]).is_empty()
                            && array(&rule["ports"]).iter().all(|port| port["port"] == 53);
                        if peer["podSelector"].is_null() || !dns_only {
                            problems.push(format!(
                                "{place}: a namespaceSelector peer other than DNS (port 53 to \
                                 selected pods): {peer}"
                            ));
                        }
                    } else if peer["podSelector"].is_null() {
                        problems.push(format!("{place}: a peer that names nothing: {peer}"));
                    }
                }
            }
        }
    }
    problems
}

#[test]
fn the_capacity_check_refuses_a_node_sized_apart_from_its_memory_limit() {
    let place = "test";
    // 1 GiB sessions (the default), 512 MiB reserve.
    assert!(node_capacity_problems(place, Some("3"), Some("512"), Some("4Gi")).is_empty());
    assert!(node_capacity_problems(place, Some("4"), None, Some("4608m")).is_empty());
    let over = node_capacity_problems(place, Some("4"), Some("512"), Some("4Gi"));
    assert!(
        over.iter().any(|p| p.contains("more than the 4096 MiB")),
        "{over:?}"
    );
    let under = node_capacity_problems(place, Some("2"), Some("512"), Some("4Gi"));
    assert!(under.iter().any(|p| p.contains("raise")), "{under:?}");
    assert_eq!(
        node_capacity_problems(place, None, None, Some("4Gi")).len(),
        1,
        "no max sessions"
    );
    assert_eq!(memory_mib("64Gi"), Some(65536));
    assert_eq!(memory_mib("4608m"), Some(4608));
    assert_eq!(memory_mib("lots"), None);
}

#[test]
fn kubernetes_overlays_run_every_service_within_limits_probes_and_policies() {
    let mut problems = Vec::new();
    for overlay in OVERLAYS {
        let Some(resources) = kustomize(overlay) else {
            return;
        };
        assert!(
            !resources.is_empty(),
            "kubectl kustomize {overlay} rendered nothing"
        );
        problems.extend(manifest_problems(overlay, &resources));
    }
    assert!(
        problems.is_empty(),
        "the Kubernetes manifests:\n{}",
        problems.join("\n")
    );
}

/// One stage of a Dockerfile: its name (`AS …`), base, and instructions with continuation lines
/// joined and comments left out.
#[derive(Debug)]
struct Stage {
    name: String,
    base: String,
    instructions: Vec<String>,
}

fn dockerfile_stages(text: &str) -> (Vec<String>, Vec<Stage>) {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let mut global = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        let words: Vec<&str> = instruction.split_whitespace().collect();
        if words
            .first()
            .is_some_and(|word| word.eq_ignore_ascii_case("FROM"))
        {
            let rest: Vec<&str> = words[1..]
                .iter()
                .copied()
                .filter(|word| !word.starts_with("--"))
                .collect();
            let name = match rest.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("AS") => (*name).to_owned(),
                _ => String::new(),
            };
            stages.push(Stage {
                name,
                base: rest.first().copied().unwrap_or_default().to_owned(),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(instruction);
        } else {
            global.push(instruction);
        }
    }
    (global, stages)
}

fn keyword(instruction: &str) -> String {
    instruction
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase()
}

/// The packages `apt-get install` lines of a stage install.
fn apt_packages(stage: &Stage) -> BTreeSet<String> {
    stage
        .instructions
        .iter()
        .filter(|i| keyword(i) == "RUN")
        .flat_map(|i| i.split("&&"))
        .filter_map(|command| {
            command
                .split_once("apt-get install")
                .map(|(_, packages)| packages)
        })
        .flat_map(str::split_whitespace)
        .filter(|word| !word.starts_with('-'))
        .map(str::to_owned)
        .collect()
}

fn users(stage: &Stage) -> Vec<String> {
    stage
        .instructions
        .iter()
        .filter(|i| keyword(i) == "USER")
        .map(|i| i.split_whitespace().nth(1).unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn dockerfile_images_carry_what_builds_and_sessions_run() {
    let text = read(DOCKERFILE);
    let (global, stages) = dockerfile_stages(&text);
    let stage = |name: &str| {
        stages
            .iter()
            .find(|stage| stage.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "{DOCKERFILE}: no `{name}` target (stages: {:?})",
                    stages.iter().map(|s| &s.name).collect::<Vec<_>>()
                )
            })
    };
    let mut problems = Vec::new();
    let tini_entrypoint = |stage: &Stage| {
        stage
            .instructions
            .iter()
            .rfind(|i| keyword(i) == "ENTRYPOINT")
            .is_some_and(|i| i.contains("tini"))
    };

    let runtime = stage("runtime");
    let packages = apt_packages(runtime);
    for package in ["python3", "nodejs", "npm", "git", "ca-certificates", "tini"] {
        if !packages.contains(package) {
            problems.push(format!(
                "{DOCKERFILE}: the runtime target does not install {package} (it installs \
                 {packages:?})"
            ));
        }
    }
    // uv from its official image at a pinned version, or pip at a pinned version.
    let uv_stages: Vec<&str> = stages
        .iter()
        .filter(|s| s.base.starts_with("ghcr.io/astral-sh/uv:"))
        .map(|s| s.name.as_str())
        .collect();
    let copies_uv = runtime.instructions.iter().any(|i| {
        keyword(i) == "COPY"
            && i.contains(" /uv")
            && (uv_stages
                .iter()
                .any(|name| i.contains(&format!("--from={name} ")))
                || i.contains("--from=ghcr.io/astral-sh/uv:"))
    });
    let pip_uv = runtime
        .instructions
        .iter()
        .any(|i| keyword(i) == "RUN" && i.contains("pip install") && i.contains("uv=="));
    if !copies_uv && !pip_uv {
        problems.push(format!(
            "{DOCKERFILE}: the runtime target has no uv (COPY --from the official \
             ghcr.io/astral-sh/uv image, or `pip install uv==…`)"
        ));
    }
    if copies_uv {
        let pinned = global
            .iter()
            .chain(stages.iter().flat_map(|s| &s.instructions))
            .filter_map(|i| i.strip_prefix("ARG UV_VERSION="))
            .any(|version| {
                !version.is_empty()
                    && version
                        .split('.')
                        .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()))
            });
        let literal = stages.iter().any(|s| {
            s.base
                .strip_prefix("ghcr.io/astral-sh/uv:")
                .is_some_and(|tag| tag.starts_with(|c: char| c.is_ascii_digit()))
        });
        if !pinned && !literal {
            problems.push(format!(
                "{DOCKERFILE}: uv's version is not pinned (`ARG UV_VERSION=x.y.z`)"
            ));
        }
    }
    for user in users(runtime) {
        if user != "0" && user != "root" && user != "0:0" && user != "root:root" {
            problems.push(format!(
                "{DOCKERFILE}: the runtime target switches to `USER {user}`: builder and node \
                 refuse to start unless they are root"
            ));
        }
    }
    if !tini_entrypoint(runtime) {
        problems.push(format!(
            "{DOCKERFILE}: the runtime target's ENTRYPOINT is not tini (PID 1 must reap)"
        ));
    }

    let service = stage("service");
    let service_packages = apt_packages(service);
    for package in ["git", "ca-certificates", "tini"] {
        if !service_packages.contains(package) {
            problems.push(format!(
                "{DOCKERFILE}: the service target does not install {package}"
            ));
        }
    }
    match users(service).last().map(String::as_str) {
        Some("0" | "root") | None => problems.push(format!(
            "{DOCKERFILE}: the service target runs as root; catalog, source and gateway need no \
             privilege (USER 10001)"
        )),
        Some(_) => {}
    }
    if !tini_entrypoint(service) {
        problems.push(format!(
            "{DOCKERFILE}: the service target's ENTRYPOINT is not tini (PID 1 must reap)"
        ));
    }

    let ignore = read(".dockerignore");
    let ignores_target = ignore.lines().map(str::trim).any(|line| {
        matches!(
            line,
            "target" | "target/" | "/target" | "/target/" | "target/**" | "**/target"
        )
    });
    if !ignores_target {
        problems.push(
            ".dockerignore does not exclude target/ (the build context would carry the whole \
             build cache)"
                .to_owned(),
        );
    }
    assert!(
        problems.is_empty(),
        "the container images:\n{}",
        problems.join("\n")
    );
}

#[test]
fn compose_runs_the_split_services_from_the_image_targets() {
    let documents = yaml_documents("compose.yaml", &read("compose.yaml"));
    let [compose] = documents.as_slice() else {
        panic!("compose.yaml holds {} documents, not one", documents.len());
    };
    let services = &compose["services"];
    let mut problems = Vec::new();
    for (name, target, command) in [
        ("catalog", "service", "catalog"),
        ("source", "service", "source"),
        ("gateway", "service", "gateway"),
        ("builder", "runtime", "builder"),
        ("node", "runtime", "node"),
    ] {
        let service = &services[name];
        if service.is_null() {
            problems.push(format!("compose.yaml: no `{name}` service"));
            continue;
        }
        if service["build"]["target"] != target || service["build"]["dockerfile"] != DOCKERFILE {
            problems.push(format!(
                "compose.yaml: `{name}` is not built from {DOCKERFILE}'s `{target}` target"
            ));
        }
        if array(&service["command"]).first().and_then(Value::as_str) != Some(command) {
            problems.push(format!(
                "compose.yaml: `{name}` does not run `plinth {command}`"
            ));
        }
        if target == "runtime" && service["privileged"] != true {
            problems.push(format!("compose.yaml: `{name}` is not privileged"));
        }
    }
    // The node's capacity follows its memory limit; the pools fit PostgreSQL's connections.
    let node = &services["node"];
    let environment = |service: &Value, name: &str| -> Option<String> {
        match &service["environment"][name] {
            Value::String(text) => Some(text.clone()),
            Value::Number(number) => Some(number.to_string()),
            _ => None,
        }
    };
    problems.extend(node_capacity_problems(
        "compose.yaml: `node`",
        environment(node, "PLINTH_NODE_MAX_SESSIONS").as_deref(),
        environment(node, "PLINTH_NODE_MEMORY_RESERVE_MB").as_deref(),
        node["mem_limit"].as_str(),
    ));
    let mut total = 0;
    for (name, variable, listens) in [
        ("catalog", "PLINTH_DATABASE_MAX_CONNECTIONS", true),
        ("source", "PLINTH_SOURCE_DATABASE_MAX_CONNECTIONS", false),
    ] {
        match environment(&services[name], variable).and_then(|text| text.parse::<u64>().ok()) {
            Some(pool) => total += connections(pool, listens),
            None => problems.push(format!("compose.yaml: `{name}` does not set {variable}")),
        }
    }
    if total > POSTGRES_MAX_CONNECTIONS - SPARE_CONNECTIONS {
        problems.push(format!(
            "compose.yaml: the database pools add up to {total} connections, past PostgreSQL's \
             {POSTGRES_MAX_CONNECTIONS} less {SPARE_CONNECTIONS} spare"
        ));
    }
    for (name, image) in [("postgres", "postgres:15"), ("minio", "minio/")] {
        if !services[name]["image"]
            .as_str()
            .is_some_and(|i| i.starts_with(image))
        {
            problems.push(format!("compose.yaml: no `{name}` service from {image}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
