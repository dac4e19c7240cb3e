//! Writing `.tiktoken` text for tests: the format is one `base64(token) rank`
//! line per token.
#![allow(dead_code)]

/// A valid vocabulary: the 256 single bytes at ranks 0..=255, then `extra`
/// lines as given.
pub fn vocabulary_text(extra: &str) -> String {
    let mut text = String::new();
    for byte in 0..=255u8 {
        text.push_str(&base64(&[byte]));
        text.push_str(&format!(" {byte}\n"));
    }
    text.push_str(extra);
    text
}

/// Plain base64 (the tests' own, to write vocabularies).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let bits = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for position in 0..4 {
            if position <= chunk.len() {
                out.push(ALPHABET[(bits >> (18 - 6 * position) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
