//! The node's gRPC services, implemented on [`crate::node::Node`]: `node` is
//! `plinth.node.v1.NodeService` (sessions and their commands; a terminal's stream is
//! `crate::pty`), `workspace` is `plinth.node.v1.WorkspaceService` (a session's files).

mod node;
mod workspace;
