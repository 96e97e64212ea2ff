//! The workspace tools both agent adapters serve, Novo's methods (`readFile`, …) and Brain's
//! tools (`read_file`, …): one engine with typed arguments and results. An adapter keeps
//! only its protocol (signatures or tokens, envelopes, receipts, idempotency): it looks the
//! tool up by its own name, parses the call's arguments into a [`Request`] (one set of
//! argument rules, [`args`]), runs it in the session ([`run`]), and gets back the answer body
//! and the turn to record, or why not.
//!
//! The answer shapes are Novo's (novo-http-workspace); Brain's tools answer the same shapes,
//! but for the two places its protocol asks otherwise ([`Dialect`]).

mod args;
mod run;

pub(crate) use args::{Args, Invalid};
pub(crate) use run::{Failed, Options, Target, run};

use plinth_proto::node::v1 as node;

/// Which adapter a call came through: its names, and the few places its answers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Novo,
    Brain,
}

impl Dialect {
    /// How the adapter names a call's arguments object in its messages.
    pub(crate) fn arguments(self) -> &'static str {
        match self {
            Dialect::Novo => "args",
            Dialect::Brain => "input",
        }
    }
}

/// A workspace tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tool {
    ReadFile,
    ListFiles,
    SearchFiles,
    FindFiles,
    EditFile,
    ApplyPatch,
    RunCommand,
    ReadCommandOutput,
    Restore,
    WriteFile,
    DeleteFile,
    WriteArtifact,
    RunArtifacts,
    ExternalChanges,
}

/// One tool: what each adapter calls it (`None`: not served there), and whether it changes
/// the workspace (Novo makes such calls idempotent by their request id).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    pub tool: Tool,
    pub novo: Option<&'static str>,
    pub brain: Option<&'static str>,
    pub mutates: bool,
}

/// Every tool, in the order the adapters list them.
pub(crate) const TOOLS: [Spec; 14] = [
    spec(
        Tool::RunCommand,
        Some("runCommand"),
        Some("run_command"),
        true,
    ),
    spec(
        Tool::ReadCommandOutput,
        Some("readCommandOutput"),
        Some("read_command_output"),
        false,
    ),
    spec(Tool::ReadFile, Some("readFile"), Some("read_file"), false),
    spec(Tool::WriteFile, None, Some("write_file"), true),
    spec(Tool::DeleteFile, None, Some("delete_file"), true),
    spec(
        Tool::ListFiles,
        Some("listFiles"),
        Some("list_files"),
        false,
    ),
    spec(
        Tool::SearchFiles,
        Some("searchFiles"),
        Some("search_files"),
        false,
    ),
    spec(
        Tool::FindFiles,
        Some("findFiles"),
        Some("find_files"),
        false,
    ),
    spec(Tool::EditFile, Some("editFile"), Some("edit_file"), true),
    spec(
        Tool::ApplyPatch,
        Some("applyPatch"),
        Some("apply_patch"),
        true,
    ),
    spec(Tool::Restore, Some("restore"), Some("restore"), true),
    spec(
        Tool::WriteArtifact,
        Some("writeRuntimeArtifact"),
        None,
        true,
    ),
    spec(Tool::RunArtifacts, Some("getRunArtifacts"), None, false),
    spec(
        Tool::ExternalChanges,
        Some("listExternalFileChanges"),
        None,
        false,
    ),
];

const fn spec(
    tool: Tool,
    novo: Option<&'static str>,
    brain: Option<&'static str>,
    mutates: bool,
) -> Spec {
    Spec {
        tool,
        novo,
        brain,
        mutates,
    }
}

impl Spec {
    /// What `dialect` calls this tool, if it serves it.
    pub(crate) fn name(&self, dialect: Dialect) -> Option<&'static str> {
        match dialect {
            Dialect::Novo => self.novo,
            Dialect::Brain => self.brain,
        }
    }
}

/// The tool `dialect` calls `name`.
pub(crate) fn named(dialect: Dialect, name: &str) -> Option<&'static Spec> {
    TOOLS.iter().find(|spec| spec.name(dialect) == Some(name))
}

/// The names of every tool `dialect` serves.
pub(crate) fn names(dialect: Dialect) -> impl Iterator<Item = &'static str> {
    TOOLS.iter().filter_map(move |spec| spec.name(dialect))
}

/// Where Novo's runtime artifacts go, beneath the working directory; left out of artifact
/// and external-change listings with git's directory.
pub(crate) const NOT_ARTIFACTS: [&str; 2] = [".novo", ".git"];

/// A tool call with its arguments checked and typed: the node's request, but for the
/// session, which [`run`] fills in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    ReadFile(node::ReadRequest),
    ListFiles(node::ListRequest),
    SearchFiles(node::SearchRequest),
    FindFiles(node::FindRequest),
    EditFile(node::EditRequest),
    /// A patch, with each operation's `type` as the caller wrote it (answered back as such).
    ApplyPatch {
        patch: node::ApplyPatchRequest,
        asked: Vec<String>,
    },
    RunCommand(node::RunCommandRequest),
    ReadCommandOutput(node::ReadOutputRequest),
    Restore(node::RestoreRequest),
    WriteFile(node::WriteRequest),
    DeleteFile(node::DeleteFileRequest),
    /// A runtime artifact: a write to a path made from the call's run, step and tool call.
    WriteArtifact(node::WriteRequest),
    /// What the run changed (artifacts), or what changed that it did not write (external).
    Changes {
        external: bool,
    },
}

/// The edit operations, by the name callers give.
const EDIT_OPERATIONS: [(&str, node::EditOperation); 5] = [
    ("create", node::EditOperation::Create),
    ("replace", node::EditOperation::Replace),
    ("insert_after", node::EditOperation::InsertAfter),
    ("insert_before", node::EditOperation::InsertBefore),
    ("append", node::EditOperation::Append),
];

/// The media types a runtime artifact may have, with the extension its file gets.
const ARTIFACT_TYPES: [(&str, &str); 2] = [("application/json", "json"), ("text/plain", "txt")];

impl Request {
    /// `tool`'s request from a call's arguments; anything wrong is [`Invalid`], naming the
    /// field, and nothing runs.
    pub(crate) fn parse(tool: Tool, args: &Args<'_>, options: &Options) -> Result<Self, Invalid> {
        use sha2::Digest as _;
        let path = || args.required("path");
        let at = || {
            args.string("path")
                .map(|path| path.unwrap_or_else(|| ".".to_owned()))
        };
        Ok(match tool {
            Tool::ReadFile => Request::ReadFile(node::ReadRequest {
                path: path()?,
                start_line: args.whole_or_zero("start_line")?,
                end_line: args.whole_or_zero("end_line")?,
                max_bytes: args.whole_or_zero("max_bytes")?,
                lines_threshold: args.whole_or_zero("lines_threshold")?,
                ..Default::default()
            }),
            Tool::ListFiles => Request::ListFiles(node::ListRequest {
                path: at()?,
                recursive: args.flag("recursive")?,
                include_hidden: args.flag("include_hidden")?,
                max_entries: args.whole_or_zero("max_entries")?,
                ..Default::default()
            }),
            Tool::SearchFiles => Request::SearchFiles(node::SearchRequest {
                pattern: args.required("pattern")?,
                path: at()?,
                glob: args.string("glob")?.unwrap_or_default(),
                literal: args.flag("literal")?,
                ignore_case: args.flag("ignore_case")?,
                // The node allows a few lines of context at most; more is that many.
                context: u32::try_from(args.whole_or_zero("context")?).unwrap_or(u32::MAX),
                limit_per_file: args.whole_or_zero("limit")?,
                max_results: args.whole_or_zero("max_results")?,
                max_bytes_per_line: args.whole_or_zero("max_bytes_per_match")?,
                ..Default::default()
            }),
            Tool::FindFiles => Request::FindFiles(node::FindRequest {
                pattern: args.required("pattern")?,
                path: at()?,
                max_entries: args.whole_or_zero("max_entries")?,
                ..Default::default()
            }),
            Tool::EditFile => {
                let path = path()?;
                let named = args.required("operation")?;
                let Some((_, operation)) = EDIT_OPERATIONS.iter().find(|(name, _)| *name == named)
                else {
                    return Err(Invalid(format!(
                        "{}.operation: {named:?} is not one of create, replace, insert_after, insert_before, append",
                        options.dialect.arguments()
                    )));
                };
                Request::EditFile(node::EditRequest {
                    path,
                    operation: *operation as i32,
                    contents: args.string("contents")?,
                    find: args.string("find")?,
                    replace_all: args.flag("replace_all")?,
                    dry_run: args.flag("dry_run")?,
                    ..Default::default()
                })
            }
            Tool::ApplyPatch => {
                let mut asked = Vec::new();
                let mut operations = Vec::new();
                for operation in args.objects("operations")? {
                    let kind = operation.required("type")?;
                    operations.push(node::PatchOperation {
                        kind: run::patch_operation_kind(&kind),
                        path: operation.required("path")?,
                        diff: operation.string("diff")?.unwrap_or_default(),
                    });
                    asked.push(kind);
                }
                Request::ApplyPatch {
                    patch: node::ApplyPatchRequest {
                        operations,
                        dry_run: args.flag("dry_run")?,
                        ..Default::default()
                    },
                    asked,
                }
            }
            Tool::RunCommand => {
                let command = args.required("command")?;
                if command.trim().is_empty() {
                    return Err(Invalid(format!(
                        "{}.command: must not be empty",
                        options.dialect.arguments()
                    )));
                }
                let mut env = args.strings("env")?;
                env.extend(options.env.iter().cloned());
                Request::RunCommand(node::RunCommandRequest {
                    command,
                    cwd: args.string("cwd")?.unwrap_or_default(),
                    env,
                    timeout_ms: args.whole_or_zero("timeout_ms")?,
                    inline_bytes: options.inline_bytes,
                    keep_bytes: options.keep_bytes,
                    ..Default::default()
                })
            }
            Tool::ReadCommandOutput => Request::ReadCommandOutput(node::ReadOutputRequest {
                output_id: path()?,
                start_line: args.whole_or_zero("start_line")?,
                end_line: args.whole_or_zero("end_line")?,
                max_bytes: args.whole_or_zero("max_bytes")?,
                ..Default::default()
            }),
            Tool::Restore => Request::Restore(node::RestoreRequest {
                token: args.required("token")?,
                ..Default::default()
            }),
            Tool::WriteFile => Request::WriteFile(node::WriteRequest {
                path: path()?,
                content: args.required("contents")?.into_bytes().into(),
                ..Default::default()
            }),
            Tool::DeleteFile => Request::DeleteFile(node::DeleteFileRequest {
                path: path()?,
                ..Default::default()
            }),
            Tool::WriteArtifact => {
                let prefix = options.dialect.arguments();
                let run = args.required("runId")?;
                if run.is_empty()
                    || run == "."
                    || run == ".."
                    || run.contains(['/', '\\', '\0'])
                    || run.len() > 200
                {
                    return Err(Invalid(format!(
                        "{prefix}.runId: one path segment (no /, not . or ..)"
                    )));
                }
                let step = args.whole("stepNumber")?.ok_or_else(|| {
                    Invalid(format!(
                        "{prefix}.stepNumber: required, a non-negative integer"
                    ))
                })?;
                let tool_call = args.required("toolCallId")?;
                let media = args.required("mediaType")?;
                let Some((_, extension)) = ARTIFACT_TYPES.iter().find(|(name, _)| *name == media)
                else {
                    return Err(Invalid(format!(
                        "{prefix}.mediaType: {media:?} is not application/json or text/plain"
                    )));
                };
                let contents = args.required("contents")?;
                let digest = plinth_kit::hex(&sha2::Sha256::digest(tool_call.as_bytes()));
                Request::WriteArtifact(node::WriteRequest {
                    path: format!(
                        "./{}/artifacts/{run}/{step}-{}.{extension}",
                        NOT_ARTIFACTS[0],
                        &digest[..16]
                    ),
                    content: contents.into_bytes().into(),
                    ..Default::default()
                })
            }
            Tool::RunArtifacts => Request::Changes { external: false },
            Tool::ExternalChanges => Request::Changes { external: true },
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::*;

    fn parse(tool: Tool, dialect: Dialect, args: Value) -> Result<Request, Invalid> {
        let Value::Object(map) = args else {
            unreachable!("test arguments are objects")
        };
        Request::parse(
            tool,
            &Args::new(&map, dialect.arguments()),
            &Options::new(dialect),
        )
    }

    #[test]
    fn every_tool_has_one_name_per_adapter_and_the_adapters_serve_what_they_list() {
        let mut novo: Vec<_> = names(Dialect::Novo).collect();
        let mut brain: Vec<_> = names(Dialect::Brain).collect();
        assert_eq!(novo.len(), 12, "Novo dispatches twelve methods");
        assert_eq!(brain.len(), 11, "Brain is served eleven tools");
        novo.sort_unstable();
        novo.dedup();
        brain.sort_unstable();
        brain.dedup();
        assert_eq!((novo.len(), brain.len()), (12, 11), "names are unique");
        for spec in &TOOLS {
            for dialect in [Dialect::Novo, Dialect::Brain] {
                if let Some(name) = spec.name(dialect) {
                    assert_eq!(
                        named(dialect, name).map(|found| found.tool),
                        Some(spec.tool)
                    );
                }
            }
        }
        assert!(named(Dialect::Brain, "readFile").is_none());
        assert!(named(Dialect::Novo, "write_file").is_none());
    }

    #[test]
    fn both_adapters_read_the_same_arguments_the_same_way() {
        for dialect in [Dialect::Novo, Dialect::Brain] {
            let read = parse(
                Tool::ReadFile,
                dialect,
                json!({ "path": "a.txt", "start_line": 2.0, "max_bytes": 10 }),
            );
            assert_eq!(
                read,
                Ok(Request::ReadFile(node::ReadRequest {
                    path: "a.txt".into(),
                    start_line: 2,
                    max_bytes: 10,
                    ..Default::default()
                })),
                "{dialect:?}"
            );
            // Listing and searching default to the working directory.
            let Ok(Request::ListFiles(list)) = parse(Tool::ListFiles, dialect, json!({})) else {
                panic!("a listing needs no argument");
            };
            assert_eq!((list.path.as_str(), list.max_entries), (".", 0));
            let prefix = dialect.arguments();
            for (tool, args, message) in [
                (
                    Tool::ReadFile,
                    json!({}),
                    format!("{prefix}.path: required, a string"),
                ),
                (
                    Tool::ReadFile,
                    json!({ "path": "a", "end_line": -3 }),
                    format!("{prefix}.end_line: must be a non-negative integer"),
                ),
                (
                    Tool::SearchFiles,
                    json!({ "pattern": "x", "literal": "yes" }),
                    format!("{prefix}.literal: must be a boolean"),
                ),
                (
                    Tool::EditFile,
                    json!({ "path": "a", "operation": "rewrite" }),
                    format!(
                        "{prefix}.operation: \"rewrite\" is not one of create, replace, insert_after, insert_before, append"
                    ),
                ),
                (
                    Tool::ApplyPatch,
                    json!({ "operations": [{ "type": "delete_file" }] }),
                    format!("{prefix}.operations[0].path: required, a string"),
                ),
                (
                    Tool::RunCommand,
                    json!({ "command": "  " }),
                    format!("{prefix}.command: must not be empty"),
                ),
                (
                    Tool::RunCommand,
                    json!({ "command": "env", "env": { "A": 1 } }),
                    format!("{prefix}.env.A: must be a string"),
                ),
            ] {
                assert_eq!(
                    parse(tool, dialect, args.clone()),
                    Err(Invalid(message)),
                    "{dialect:?} {tool:?} {args}"
                );
            }
        }
    }

    #[test]
    fn a_command_carries_the_adapters_options_and_its_own_environment() {
        let mut options = Options::new(Dialect::Brain);
        options.inline_bytes = 64;
        options.env = vec![("MARK".into(), "1".into())];
        let map: Map<String, Value> = serde_json::from_value(
            json!({ "command": "true", "cwd": "sub", "env": { "A": "x" }, "timeout_ms": 500 }),
        )
        .expect("object");
        let Ok(Request::RunCommand(command)) =
            Request::parse(Tool::RunCommand, &Args::new(&map, "input"), &options)
        else {
            panic!("a valid command");
        };
        assert_eq!(
            (
                command.cwd.as_str(),
                command.timeout_ms,
                command.inline_bytes,
                command.env.get("A").map(String::as_str),
                command.env.get("MARK").map(String::as_str),
            ),
            ("sub", 500, 64, Some("x"), Some("1"))
        );
    }

    #[test]
    fn an_artifact_lands_under_the_run_named_by_its_step_and_tool_call() {
        let Ok(Request::WriteArtifact(write)) = parse(
            Tool::WriteArtifact,
            Dialect::Novo,
            json!({ "runId": "run_1", "stepNumber": 3, "toolCallId": "call_a",
                    "mediaType": "text/plain", "contents": "hi" }),
        ) else {
            panic!("a valid artifact");
        };
        assert!(
            write.path.starts_with("./.novo/artifacts/run_1/3-") && write.path.ends_with(".txt"),
            "{}",
            write.path
        );
        for (args, message) in [
            (
                json!({ "runId": "..", "stepNumber": 1, "toolCallId": "c", "mediaType": "text/plain", "contents": "" }),
                "args.runId: one path segment (no /, not . or ..)",
            ),
            (
                json!({ "runId": "r", "toolCallId": "c", "mediaType": "text/plain", "contents": "" }),
                "args.stepNumber: required, a non-negative integer",
            ),
            (
                json!({ "runId": "r", "stepNumber": 1, "toolCallId": "c", "mediaType": "image/png", "contents": "" }),
                "args.mediaType: \"image/png\" is not application/json or text/plain",
            ),
        ] {
            assert_eq!(
                parse(Tool::WriteArtifact, Dialect::Novo, args),
                Err(Invalid(message.to_owned()))
            );
        }
    }
}
