//! Quoting an argv for `/bin/sh`. The exec API takes one shell command string; `plinth exec`
//! is given an argv, which must reach the remote program exactly, so each argument is quoted
//! such that the remote shell's word splitting, expansion and globbing give it back unchanged.

/// Bytes that mean nothing to `sh` in an unquoted word, so an argument made only of them can
/// go as it is (which keeps a session's recorded turns readable).
fn is_plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&byte)
}

/// One argument as a single `sh` word: as it is when every byte is plain, else in single
/// quotes, inside which `sh` interprets nothing; a `'` itself is written `'\''` (close, an
/// escaped quote, reopen).
pub fn quote(argument: &str) -> String {
    if !argument.is_empty() && argument.bytes().all(is_plain) {
        return argument.to_owned();
    }
    quote_always(argument)
}

/// One argument in single quotes, whatever it holds.
fn quote_always(argument: &str) -> String {
    let mut quoted = String::with_capacity(argument.len() + 2);
    quoted.push('\'');
    for c in argument.chars() {
        if c == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    quoted
}

/// An argv as one `sh` command line that runs exactly it. The first word is always quoted:
/// in command position a plain word could still be a reserved word (`if`, `!`) or an
/// assignment (`A=1`), and a quoted one is neither.
pub fn join(argv: &[String]) -> String {
    argv.iter()
        .enumerate()
        .map(|(index, argument)| {
            if index == 0 {
                quote_always(argument)
            } else {
                quote(argument)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the joined argv with the local `sh`, as the remote one will, through a program that
    /// prints each argument on its own line.
    fn through_sh(argv: &[&str]) -> Vec<String> {
        let mut full = vec!["printf".to_owned(), "%s\\n".to_owned()];
        full.extend(argv.iter().map(|a| (*a).to_owned()));
        let output = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(join(&full))
            .env("HOME", "/should-not-appear")
            .output()
            .expect("sh runs");
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_argument_reaches_the_program_unchanged() {
        let argv = [
            "a b",
            "$HOME",
            "${HOME}",
            "`id`",
            "$(id)",
            "it's",
            "'",
            "''",
            "*",
            "~",
            "a;b",
            "a|b",
            "a&&b",
            "\\n",
            "\"quoted\"",
            "#comment",
            "tab\there",
            "ünïcode",
            "!",
            "plain-arg_1.0",
        ];
        assert_eq!(through_sh(&argv), argv);
    }

    #[test]
    fn plain_words_stay_readable_and_empty_ones_survive() {
        assert_eq!(quote("python3"), "python3");
        assert_eq!(join(&["if".into(), "x".into()]), "'if' x");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), "'it'\\''s'");
        let empty = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "{} {}",
                join(&["printf".into(), "[%s]".into()]),
                quote("")
            ))
            .output()
            .expect("sh runs");
        assert_eq!(empty.stdout, b"[]");
    }
}
