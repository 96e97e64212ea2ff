//! Sessions, their turns, the node agents they run on, and tasks: the domain types and their
//! rules. A session pins what it reads (environment, version, layer tree) when it is created
//! and keeps it for its whole life (UHP §6); every exec or file call is a turn that records
//! the version it read (§6.5).

use crate::model::{EnvironmentId, Scope, prefixed_id};

prefixed_id!(
    /// `sess_` followed by 32 lowercase hex digits.
    SessionId,
    "sess_"
);
prefixed_id!(
    /// `node_` followed by 32 lowercase hex digits.
    NodeId,
    "node_"
);
prefixed_id!(
    /// `task_` followed by 32 lowercase hex digits.
    TaskId,
    "task_"
);

/// Whether a session can still run commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    /// Placed on a node; commands run.
    Active,
    /// Ended: its working directory is gone.
    Ended,
}

impl SessionStatus {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Ended => "ended",
        }
    }

    /// From its stored form.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(SessionStatus::Active),
            "ended" => Some(SessionStatus::Ended),
            _ => None,
        }
    }
}

/// A session: where it runs and what it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Its id.
    pub id: SessionId,
    /// Its scope.
    pub scope: Scope,
    /// The environment it reads.
    pub environment_id: EnvironmentId,
    /// That environment's name when the session was created.
    pub environment_name: String,
    /// That environment's entry command, if any.
    pub entry: String,
    /// The pinned version.
    pub version: u32,
    /// The environment's slug: the mount is `/env/<slug>`.
    pub slug: String,
    /// The pinned version's layer tree.
    pub layer_tree: String,
    /// The node it runs on.
    pub node_id: NodeId,
    /// That node's gRPC address.
    pub node_address: String,
    /// The harness it was created for; empty when none.
    pub harness_id: String,
    /// Its working directory once attached; empty before.
    pub workdir: String,
    /// Whether its node isolates commands.
    pub isolated: bool,
    /// Active or ended.
    pub status: SessionStatus,
    /// Turns recorded.
    pub turns: u64,
    /// Creation time, ms since the epoch.
    pub created_at_ms: i64,
    /// End time, ms since the epoch; 0 while active.
    pub ended_at_ms: i64,
    /// Who it was made for (a Brain binding's label); empty when a client asked for it.
    pub owner: String,
}

/// What a turn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnKind {
    /// A shell command.
    Exec,
    /// A working-directory file read.
    ReadFile,
    /// A working-directory file write.
    WriteFile,
    /// A working-directory delete.
    DeleteFile,
    /// A directory listing.
    ListFiles,
    /// A content search.
    SearchFiles,
    /// A file-name glob search.
    FindFiles,
    /// An edit of one file.
    EditFile,
    /// A patch of several files.
    ApplyPatch,
    /// A read of a command's kept output.
    ReadOutput,
    /// Files put back from a rollback token.
    Restore,
    /// A listing of the files changed in the session.
    ListChanges,
}

impl TurnKind {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnKind::Exec => "exec",
            TurnKind::ReadFile => "read_file",
            TurnKind::WriteFile => "write_file",
            TurnKind::DeleteFile => "delete_file",
            TurnKind::ListFiles => "list_files",
            TurnKind::SearchFiles => "search_files",
            TurnKind::FindFiles => "find_files",
            TurnKind::EditFile => "edit_file",
            TurnKind::ApplyPatch => "apply_patch",
            TurnKind::ReadOutput => "read_output",
            TurnKind::Restore => "restore",
            TurnKind::ListChanges => "list_changes",
        }
    }

    /// From its stored or sent form.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "exec" => Some(TurnKind::Exec),
            "read_file" => Some(TurnKind::ReadFile),
            "write_file" => Some(TurnKind::WriteFile),
            "delete_file" => Some(TurnKind::DeleteFile),
            "list_files" => Some(TurnKind::ListFiles),
            "search_files" => Some(TurnKind::SearchFiles),
            "find_files" => Some(TurnKind::FindFiles),
            "edit_file" => Some(TurnKind::EditFile),
            "apply_patch" => Some(TurnKind::ApplyPatch),
            "read_output" => Some(TurnKind::ReadOutput),
            "restore" => Some(TurnKind::Restore),
            "list_changes" => Some(TurnKind::ListChanges),
            _ => None,
        }
    }
}

/// Most bytes of a turn's detail (a command or a path) kept in the record.
pub const MAX_TURN_DETAIL_BYTES: usize = 4096;

/// One exec or file call of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The session.
    pub session_id: SessionId,
    /// 1, 2, … in order.
    pub sequence: u64,
    /// What it did.
    pub kind: TurnKind,
    /// The command or the path (cut to [`MAX_TURN_DETAIL_BYTES`]).
    pub detail: String,
    /// The version it read.
    pub version: u32,
    /// When it was recorded.
    pub at_ms: i64,
    /// The command's exit status (exec only).
    pub exit_code: Option<i32>,
}

/// A node agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Its gRPC address.
    pub address: String,
    /// Whether it isolates commands.
    pub isolated: bool,
    /// Where it keeps sessions (empty when it did not say).
    pub sessions_dir: String,
}

/// A task: an input run in the session created for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// Its input.
    pub input: String,
    /// The harness it names; empty when none.
    pub harness_id: String,
    /// Its metadata as given (a JSON object).
    pub metadata: String,
    /// Its session (which says the environment and version).
    pub session: Session,
    /// Creation time, ms since the epoch.
    pub created_at_ms: i64,
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_strictly() {
        let id = SessionId::generate();
        assert_eq!(SessionId::parse(id.as_str()), Some(id.clone()));
        assert!(SessionId::parse("sess_").is_none());
        assert!(SessionId::parse(&id.as_str().to_uppercase()).is_none());
        assert!(NodeId::parse(id.as_str()).is_none());
    }

    #[test]
    fn details_are_cut_on_a_character_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }
}
