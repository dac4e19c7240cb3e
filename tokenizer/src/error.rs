//! The crate's one error type.
//!
//! A tokenizer user meets errors in a handful of places (a vocabulary file, a
//! special token in the text, an id that decodes to nothing, a backend that is not
//! there); every one of them says what to change, starts with `Fix:`, and keeps
//! the error it came from (a file's I/O error, the pre-tokenizer's, the GPU
//! backend's) as its [`source`](std::error::Error::source).

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::pretokenize::PretokenizeError;

/// What went wrong, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A `.tiktoken` vocabulary could not be read or is malformed; the message
    /// names the line.
    Vocabulary,
    /// The special tokens given to a constructor are unusable (empty, repeated,
    /// or an id an ordinary token already has).
    SpecialTokens,
    /// [`Tokenizer::encode`](crate::Tokenizer::encode) found a special token in the
    /// text that the call did not allow.
    DisallowedSpecialToken,
    /// A token id that is neither a rank of the vocabulary nor a special token.
    UnknownToken,
    /// Decoded bytes that are not UTF-8 asked for as a `String`.
    InvalidUtf8,
    /// The backend asked for cannot run this tokenizer (no device, or no GPU
    /// pre-tokenizer for its pattern).
    Backend,
    /// The pre-tokenizer refused the text or failed.
    Split,
}

/// Why a call failed. The message starts with `Fix:` and says what to change.
#[derive(Clone)]
pub struct TokenizerError {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl TokenizerError {
    /// An error of `kind`; a `Fix:` prefix is added to `message` when missing.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.starts_with("Fix:") {
            message
        } else {
            format!("Fix: {message}")
        };
        TokenizerError {
            kind,
            message,
            source: None,
        }
    }

    /// The same error, caused by `source`.
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, starting with `Fix:`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("TokenizerError");
        debug
            .field("kind", &self.kind)
            .field("message", &self.message);
        if let Some(source) = &self.source {
            debug.field("source", &source.to_string());
        }
        debug.finish()
    }
}

impl Error for TokenizerError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn Error + 'static))
    }
}

impl From<PretokenizeError> for TokenizerError {
    fn from(error: PretokenizeError) -> Self {
        TokenizerError::new(ErrorKind::Split, error.message().to_owned()).with_source(error)
    }
}
