//! Fair CPU between scopes on one node. Every session has a cgroup of its own, and sibling
//! cgroups share a contended CPU by their weights; with equal weights a scope running forty
//! sessions would get forty times the CPU of a scope running one. So the node divides a
//! scope's weight among its sessions here: each session of a scope with `n` live sandboxes
//! gets `1 / d` of a lone session's weight, where `d` is a power of two with `n <= d < 2n`
//! (once it has grown; see below). Scopes then share a contended CPU within a factor of two of
//! evenly, whatever each runs, and a session keeps any `cpu_millicores` limit of its own.
//!
//! `d` doubles when a scope's sessions outgrow it and halves only when they fall below half
//! of it, so a scope whose count moves back and forth across a power of two rewrites its
//! sessions' weights only once per doubling or halving: attaching and ending sessions cost
//! one write each, amortized, however many the scope has.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use plinth_sandbox::cgroup::CpuWeight;

/// Every scope's sessions with a sandbox on this node, and the divisor of each scope's weight.
#[derive(Debug, Default)]
pub struct Shares {
    scopes: Mutex<HashMap<String, Scope>>,
}

#[derive(Debug, Default)]
struct Scope {
    divisor: u32,
    members: HashMap<String, CpuWeight>,
}

/// A session's part of its scope's weight, given back (and the scope's other sessions
/// reweighed when their divisor changes) when dropped.
#[derive(Debug)]
pub struct Held {
    shares: Arc<Shares>,
    scope: String,
    session: String,
}

impl Shares {
    /// Counts `session` (whose cgroup's weight `weight` sets) among `scope`'s and sets the
    /// weights that changed.
    pub fn join(self: &Arc<Self>, scope: &str, session: &str, weight: CpuWeight) -> Held {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = scopes.entry(scope.to_owned()).or_default();
        entry.members.insert(session.to_owned(), weight);
        let count = u32::try_from(entry.members.len()).unwrap_or(u32::MAX);
        if count > entry.divisor {
            entry.divisor = count.checked_next_power_of_two().unwrap_or(u32::MAX);
            reweigh(scope, entry, None);
        } else {
            reweigh(scope, entry, Some(session));
        }
        Held {
            shares: self.clone(),
            scope: scope.to_owned(),
            session: session.to_owned(),
        }
    }

    /// The divisor of `scope`'s weight now (0 when it has no session here).
    pub fn divisor(&self, scope: &str) -> u32 {
        let scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        scopes.get(scope).map_or(0, |entry| entry.divisor)
    }

    fn leave(&self, scope: &str, session: &str) {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = scopes.get_mut(scope) else {
            return;
        };
        entry.members.remove(session);
        let count = u32::try_from(entry.members.len()).unwrap_or(u32::MAX);
        if count == 0 {
            scopes.remove(scope);
            return;
        }
        if count < entry.divisor / 2 {
            entry.divisor = count.checked_next_power_of_two().unwrap_or(u32::MAX);
            reweigh(scope, entry, None);
        }
    }
}

/// Writes the scope's divisor to `only` (one session), or to every session of it.
fn reweigh(scope: &str, entry: &Scope, only: Option<&str>) {
    let members = entry
        .members
        .iter()
        .filter(|(id, _)| only.is_none_or(|only| only == id.as_str()));
    for (session, weight) in members {
        if let Err(error) = weight.set_divisor(entry.divisor) {
            tracing::warn!(%scope, %session, %error, "cannot set a session's CPU weight");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shares.leave(&self.scope, &self.session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(dir: &std::path::Path, count: usize) -> Vec<(std::path::PathBuf, CpuWeight)> {
        (0..count)
            .map(|index| {
                let path = dir.join(format!("w{index}"));
                std::fs::write(&path, "").expect("a weight file");
                (path.clone(), CpuWeight::file(path, 1024))
            })
            .collect()
    }

    fn read(path: &std::path::Path) -> String {
        std::fs::read_to_string(path).expect("reading")
    }

    #[test]
    fn a_scopes_weight_is_divided_among_its_sessions_and_given_back() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shares = Arc::new(Shares::default());
        let many = weights(dir.path(), 5);
        let mut held = Vec::new();
        for (index, (_, weight)) in many.iter().enumerate() {
            held.push(shares.join("acme", &format!("s{index}"), weight.clone()));
        }
        assert_eq!(shares.divisor("acme"), 8);
        for (path, _) in &many {
            assert_eq!(read(path), "128", "1024 / 8 for each of five");
        }
        let other_dir = tempfile::tempdir().expect("a temporary directory");
        let other = weights(other_dir.path(), 1);
        let globex = shares.join("globex", "g0", other[0].1.clone());
        assert_eq!(
            read(&other[0].0),
            "1024",
            "a scope's lone session keeps the whole weight"
        );
        // Down to four: still 8 (no rewrite back and forth across a power of two); to three: 4.
        held.pop();
        assert_eq!(shares.divisor("acme"), 8);
        held.pop();
        assert_eq!(shares.divisor("acme"), 4);
        for (path, _) in &many[..3] {
            assert_eq!(read(path), "256");
        }
        drop(held);
        assert_eq!(shares.divisor("acme"), 0);
        drop(globex);
        assert_eq!(shares.divisor("globex"), 0);
    }
}
