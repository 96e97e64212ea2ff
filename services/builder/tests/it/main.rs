//! plinth-builder's integration tests: real builds in the real sandbox (root, and for some uv,
//! python3 and npm), offline, from fixtures the tests make.

mod builds;
mod disk;
mod fixtures;
mod isolation;
