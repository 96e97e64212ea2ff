//! The operators' kit stays in step with the metrics Plinth exports: every metric the Grafana
//! dashboards (`deploy/grafana/*.json`) and the alerting rules (`deploy/prometheus/`) query is
//! in the README's metrics table, every alert has a runbook line in the README, and the
//! `PrometheusRule` carries the same rules as the plain rules file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

const TABLE_START: &str = "<!-- metrics-table:start -->";
const TABLE_END: &str = "<!-- metrics-table:end -->";
const RULES: &str = "deploy/prometheus/alerts.yml";
const PROMETHEUS_RULE: &str = "deploy/prometheus/prometheusrule.yaml";
const RUNBOOK_URL: &str = "README.md#alerts";
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

/// The README's metrics table (between the markers): metric name → type.
pub(crate) fn metrics_table() -> BTreeMap<String, Kind> {
    let readme = read("README.md");
    let start = readme
        .find(TABLE_START)
        .unwrap_or_else(|| panic!("README.md: no `{TABLE_START}` line"))
        + TABLE_START.len();
    let end = readme[start..]
        .find(TABLE_END)
        .unwrap_or_else(|| panic!("README.md: no `{TABLE_END}` line after `{TABLE_START}`"))
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
                    "README.md metrics table: a line between the markers is not a table row: {line}"
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
            "README.md metrics table: a row has {} columns, not 5 (metric, type, labels, \
             exported by, meaning): {line}",
            cells.len()
        );
        let name = cells[0]
            .strip_prefix('`')
            .and_then(|cell| cell.strip_suffix('`'))
            .unwrap_or_else(|| {
                panic!(
                    "README.md metrics table: the first column is not a name in backticks: {line}"
                )
            });
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "README.md metrics table: `{name}` is not a metric name ([a-z0-9_]+)"
        );
        let kind = match cells[1].split_whitespace().next() {
            Some("counter") => Kind::Counter,
            Some("gauge") => Kind::Gauge,
            Some("histogram") => Kind::Histogram,
            _ => panic!(
                "README.md metrics table: `{name}` has type `{}`, not counter, gauge or histogram",
                cells[1]
            ),
        };
        if kind == Kind::Counter {
            assert!(
                name.ends_with("_total"),
                "README.md metrics table: the counter `{name}` does not end in `_total`"
            );
        }
        assert!(
            table.insert(name.to_owned(), kind).is_none(),
            "README.md metrics table: `{name}` is listed twice"
        );
    }
    assert!(
        !table.is_empty(),
        "README.md: the metrics table between `{TABLE_START}` and `{TABLE_END}` has no rows"
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
                "{place}: `{name}` is not in README.md's metrics table (nor a `_bucket`, `_sum` \
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
fn readme_metrics_table_lists_the_exported_metrics() {
    let table = metrics_table();
    for name in [
        "plinth_build_info",
        "plinth_http_requests_total",
        "plinth_grpc_server_requests_total",
        "process_cpu_seconds_total",
    ] {
        assert!(
            table.contains_key(name),
            "README.md metrics table: `{name}` is missing"
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

/// The README's `### Alerts` section, up to the next heading of its level or above.
fn readme_alerts_section() -> String {
    let readme = read("README.md");
    let mut lines = readme
        .lines()
        .skip_while(|line| line.trim_end() != "### Alerts");
    assert!(
        lines.next().is_some(),
        "README.md: no `### Alerts` section (the alerts' runbook_url points at it)"
    );
    lines
        .take_while(|line| !line.starts_with("## ") && !line.starts_with("### "))
        .collect::<Vec<_>>()
        .join("\n")
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
    let runbooks = readme_alerts_section();
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
                "{place}: no runbook line with **{}** in README.md's `### Alerts` section",
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
