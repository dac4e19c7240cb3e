//! Special tokens: strings such as `<|endoftext|>` that a model gives one id of
//! its own, outside the vocabulary's ranks.
//!
//! tiktoken treats them as ordinary text unless the caller allows them, and by
//! default refuses a text that contains one it did not allow (a prompt must not
//! smuggle in a control token). This module holds an encoding's special tokens
//! and finds them in text: the leftmost occurrence of any of the tokens searched
//! for, the longest of those starting there. An encoding has a handful, so each
//! keeps the position of its next occurrence and is searched again only once the
//! text has moved past it: a scan costs `O(tokens · text)` at worst, not per
//! match.

use crate::error::{ErrorKind, TokenizerError};
use crate::vocab::Vocabulary;

/// One special token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    /// Its text, e.g. `<|endoftext|>`.
    pub text: String,
    /// Its id, outside the vocabulary's ranks.
    pub id: u32,
}

/// An encoding's special tokens, checked against its vocabulary.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialTokens {
    tokens: Vec<SpecialToken>,
}

fn special_error(message: String) -> TokenizerError {
    TokenizerError::new(ErrorKind::SpecialTokens, message)
}

impl SpecialTokens {
    /// Checks `tokens`: non-empty text, no text or id twice, no id that the
    /// vocabulary already gives an ordinary token.
    pub(crate) fn new(
        tokens: &[(&str, u32)],
        vocabulary: &Vocabulary,
    ) -> Result<Self, TokenizerError> {
        let mut checked: Vec<SpecialToken> = Vec::with_capacity(tokens.len());
        for &(text, id) in tokens {
            if text.is_empty() {
                return Err(special_error(format!(
                    "Fix: special token {id} has empty text; give every special token its text"
                )));
            }
            if let Some(ordinary) = vocabulary.token(id) {
                return Err(special_error(format!(
                    "Fix: special token {text:?} has id {id}, which the vocabulary gives to {:?}; \
                     use an id outside the vocabulary's ranks",
                    String::from_utf8_lossy(ordinary)
                )));
            }
            if id == u32::MAX {
                return Err(special_error(format!(
                    "Fix: special token {text:?} has id {id}; use an id below 4294967295"
                )));
            }
            if let Some(other) = checked
                .iter()
                .find(|other| other.text == text || other.id == id)
            {
                return Err(special_error(format!(
                    "Fix: special tokens {:?} ({}) and {text:?} ({id}) repeat a text or an id; give each its own",
                    other.text, other.id
                )));
            }
            checked.push(SpecialToken {
                text: text.to_owned(),
                id,
            });
        }
        Ok(SpecialTokens { tokens: checked })
    }

    pub(crate) fn all(&self) -> &[SpecialToken] {
        &self.tokens
    }

    /// The token of `id`, if it is special.
    pub(crate) fn by_id(&self, id: u32) -> Option<&SpecialToken> {
        self.tokens.iter().find(|token| token.id == id)
    }

    /// The token whose text is `text`.
    pub(crate) fn by_text(&self, text: &str) -> Option<&SpecialToken> {
        self.tokens.iter().find(|token| token.text == text)
    }
}

/// Finds the tokens of a set in one text, left to right (see the module docs).
pub(crate) struct Finder<'a> {
    text: &'a str,
    /// (token, byte offset of its next occurrence at or after the search
    /// position, `usize::MAX` once there is none).
    next: Vec<(&'a SpecialToken, usize)>,
}

impl<'a> Finder<'a> {
    pub(crate) fn new(text: &'a str, tokens: impl Iterator<Item = &'a SpecialToken>) -> Self {
        let next = tokens
            .map(|token| (token, text.find(token.text.as_str()).unwrap_or(usize::MAX)))
            .collect();
        Finder { text, next }
    }

    /// The first occurrence at or after byte `from` (leftmost; longest of those
    /// starting at the same byte): its offset and token.
    pub(crate) fn find_from(&mut self, from: usize) -> Option<(usize, &'a SpecialToken)> {
        let text = self.text;
        let mut best: Option<(usize, &'a SpecialToken)> = None;
        for (token, next) in &mut self.next {
            if *next != usize::MAX && *next < from {
                *next = text
                    .get(from..)
                    .and_then(|rest| rest.find(token.text.as_str()))
                    .map_or(usize::MAX, |offset| from + offset);
            }
            if *next == usize::MAX {
                continue;
            }
            let better = match best {
                None => true,
                Some((offset, chosen)) => {
                    *next < offset || (*next == offset && token.text.len() > chosen.text.len())
                }
            };
            if better {
                best = Some((*next, token));
            }
        }
        best
    }
}
