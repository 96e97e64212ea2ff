//! Sealing workspace adapters' credentials at rest. A Novo secret is an HMAC key both sides
//! must hold, so the catalog cannot keep only a digest of it; instead every stored credential
//! (Novo secrets and Brain tokens' digests alike, current and previous) is sealed with
//! ChaCha20-Poly1305 under a key the catalog is given by configuration and never stores. A copy
//! of the database alone yields no usable secret; the key and the database together do.
//!
//! Each sealed value is `v1:` + base64 of a random 96-bit nonce, the ciphertext and its tag;
//! the adapter's id is the associated data, so a value copied onto another adapter's row does
//! not open. The slot (current or previous) is deliberately not bound: a rotation moves the
//! current value to the previous slot in one statement, without opening it. Rows carry the
//! id of the key that sealed them, so a catalog given another key says so instead of guessing.
//!
//! ChaCha20-Poly1305 comes from `ring`, already in the build through rustls; random nonces are
//! safe for far more seals than a catalog makes (one per registration or rotation).

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::Digest as _;

/// Bytes in a seal key.
pub const KEY_BYTES: usize = 32;

/// How to make a key, for messages.
pub const MAKE_A_KEY: &str = "make one with `head -c 32 /dev/urandom | base64 > seal.key && chmod 600 seal.key` \
     and name it with `[catalog] seal_key_file = \"/path/to/seal.key\"`, or put its contents in \
     PLINTH_SEAL_KEY";

const FORMAT: &str = "v1:";

/// The key that seals adapter credentials. It never prints: `Debug` shows its id only.
#[derive(Clone)]
pub struct SealKey {
    key: LessSafeKey,
    id: String,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey").field("id", &self.id).finish()
    }
}

/// Why a key could not be had, or a value not sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The key's text is not base64 of 32 bytes.
    #[error("the seal key {0}: it must be 32 random bytes in base64; {MAKE_A_KEY}")]
    KeyFormat(String),
    /// The key file could not be read or written.
    #[error("cannot {action} the seal key file {}: {source}. The key is 32 random bytes in base64: {MAKE_A_KEY}", path.display())]
    KeyFile {
        /// read or create.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The operating system's random source failed.
    #[error("the operating system's random source failed: {0}")]
    Random(String),
    /// A row was sealed with a key other than this one.
    #[error(
        "the credential of workspace adapter {adapter} was sealed with seal key {sealed_with}, \
         but this catalog's seal key is {key}: start every catalog on this database with the key \
         it was sealed with (catalog.seal_key_file or PLINTH_SEAL_KEY). Without that key the \
         adapter cannot be verified: delete it and register it again"
    )]
    WrongKey {
        /// The adapter.
        adapter: String,
        /// The id of the key its row names.
        sealed_with: String,
        /// The id of this catalog's key.
        key: String,
    },
    /// A value does not open with the key its row names.
    #[error(
        "the sealed credential of workspace adapter {adapter} does not open with seal key {key}: \
         it was altered or damaged. Delete the adapter and register it again"
    )]
    Damaged {
        /// The adapter.
        adapter: String,
        /// This catalog's key id.
        key: String,
    },
}

impl SealKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        if bytes.len() != KEY_BYTES {
            return Err(SealError::KeyFormat(format!(
                "is {} bytes long",
                bytes.len()
            )));
        }
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .map_err(|_| SealError::KeyFormat("was refused by the cipher".to_owned()))?;
        let mut hasher = sha2::Sha256::new();
        hasher.update(b"plinth seal key id\0");
        hasher.update(bytes);
        let id = hex(&hasher.finalize()[..8]);
        Ok(SealKey {
            key: LessSafeKey::new(unbound),
            id,
        })
    }

    /// A key from base64 text (surrounding whitespace ignored), as a key file or
    /// `PLINTH_SEAL_KEY` holds it.
    pub fn from_base64(text: &str) -> Result<Self, SealError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| SealError::KeyFormat("is not base64".to_owned()))?;
        Self::from_bytes(&bytes)
    }

    /// Reads a key file.
    pub fn read_file(path: &Path) -> Result<Self, SealError> {
        let text = std::fs::read_to_string(path).map_err(|source| SealError::KeyFile {
            action: "read",
            path: path.to_owned(),
            source,
        })?;
        Self::from_base64(&text).map_err(|error| match error {
            SealError::KeyFormat(why) => {
                SealError::KeyFormat(format!("in {} {why}", path.display()))
            }
            other => other,
        })
    }

    /// Reads the key file at `path`, or makes one there (32 random bytes, mode 0600) when
    /// there is none yet. Answers the key and whether it was made now. Two processes racing
    /// to make it end up with the same key: the file appears whole, by a link that never
    /// replaces one already there.
    pub fn read_or_create_file(path: &Path) -> Result<(Self, bool), SealError> {
        if path.exists() {
            return Ok((Self::read_file(path)?, false));
        }
        let mut bytes = [0u8; KEY_BYTES];
        getrandom::fill(&mut bytes).map_err(|error| SealError::Random(error.to_string()))?;
        let text = format!("{}\n", STANDARD.encode(bytes));
        let failed = |source| SealError::KeyFile {
            action: "create",
            path: path.to_owned(),
            source,
        };
        let draft = path.with_extension(format!("draft-{}", std::process::id()));
        let written = (|| {
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&draft)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })();
        let linked = written.and_then(|()| std::fs::hard_link(&draft, path));
        let _ = std::fs::remove_file(&draft);
        match linked {
            Ok(()) => {
                if let Some(dir) = path.parent()
                    && let Ok(dir) = std::fs::File::open(dir)
                {
                    let _ = dir.sync_all();
                }
                Ok((Self::from_bytes(&bytes)?, true))
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok((Self::read_file(path)?, false))
            }
            Err(error) => Err(failed(error)),
        }
    }

    /// The key's id: the first 8 bytes of a SHA-256 of it, in hex. Naming it reveals nothing
    /// of the key.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Seals `plaintext` for `adapter`. The empty string (no credential) stays empty.
    pub fn seal(&self, adapter: &str, plaintext: &str) -> Result<String, SealError> {
        if plaintext.is_empty() {
            return Ok(String::new());
        }
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|error| SealError::Random(error.to_string()))?;
        let mut in_out = plaintext.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(adapter.as_bytes()),
                &mut in_out,
            )
            .map_err(|_| SealError::Random("the cipher refused to seal".to_owned()))?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&in_out);
        Ok(format!("{FORMAT}{}", STANDARD.encode(sealed)))
    }

    /// Opens what [`SealKey::seal`] made for `adapter`. The empty string stays empty; anything
    /// that does not open (altered, another adapter's, another key's) is
    /// [`SealError::Damaged`], never a panic and never a wrong value.
    pub fn open(&self, adapter: &str, sealed: &str) -> Result<String, SealError> {
        if sealed.is_empty() {
            return Ok(String::new());
        }
        let damaged = || SealError::Damaged {
            adapter: adapter.to_owned(),
            key: self.id.clone(),
        };
        let mut bytes = sealed
            .strip_prefix(FORMAT)
            .and_then(|text| STANDARD.decode(text).ok())
            .ok_or_else(damaged)?;
        if bytes.len() < NONCE_LEN {
            return Err(damaged());
        }
        let (nonce, ciphertext) = bytes.split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| damaged())?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(adapter.as_bytes()), ciphertext)
            .map_err(|_| damaged())?;
        String::from_utf8(plain.to_vec()).map_err(|_| damaged())
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SealKey {
        SealKey::from_bytes(&[byte; KEY_BYTES]).expect("key")
    }

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_adapter() {
        let one = key(1);
        let sealed = one.seal("wadp_a", "env_secret_0123456789").expect("sealed");
        assert!(sealed.starts_with("v1:"));
        assert!(!sealed.contains("env_secret"));
        assert_ne!(
            sealed,
            one.seal("wadp_a", "env_secret_0123456789").expect("again"),
            "every seal has its own nonce"
        );
        assert_eq!(
            one.open("wadp_a", &sealed).expect("opens"),
            "env_secret_0123456789"
        );
        assert!(matches!(
            one.open("wadp_b", &sealed),
            Err(SealError::Damaged { .. })
        ));
        assert!(matches!(
            key(2).open("wadp_a", &sealed),
            Err(SealError::Damaged { .. })
        ));
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).expect("ascii");
        assert!(one.open("wadp_a", &altered).is_err());
        for junk in [
            "plain",
            "v1:",
            "v1:!!!",
            "v1:AAAA",
            "v2:AAAAAAAAAAAAAAAAAAAAAAAA",
        ] {
            assert!(one.open("wadp_a", junk).is_err(), "{junk}");
        }
        assert_eq!(one.seal("wadp_a", "").expect("empty"), "");
        assert_eq!(one.open("wadp_a", "").expect("empty"), "");
        assert_ne!(one.id(), key(2).id());
        assert_eq!(one.id().len(), 16);
        assert!(!format!("{one:?}").contains("[1"), "the key never prints");
    }

    #[test]
    fn keys_are_32_bytes_of_base64() {
        let text = STANDARD.encode([9u8; KEY_BYTES]);
        assert_eq!(
            SealKey::from_base64(&format!(" {text}\n"))
                .expect("key")
                .id(),
            key(9).id()
        );
        for bad in ["", "not base64!", &STANDARD.encode([1u8; 16])] {
            let error = SealKey::from_base64(bad).expect_err("refused");
            assert!(
                error.to_string().contains("head -c 32 /dev/urandom"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_key_file_is_made_once_private_and_then_reused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("seal.key");
        let (made, created) = SealKey::read_or_create_file(&path).expect("made");
        assert!(created);
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, created) = SealKey::read_or_create_file(&path).expect("read");
        assert!(!created);
        assert_eq!(made.id(), again.id());
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            1,
            "no draft is left behind"
        );
        std::fs::write(&path, "garbage").expect("write");
        let error = SealKey::read_or_create_file(&path).expect_err("refused");
        assert!(error.to_string().contains("seal.key"), "{error}");
    }
}
