//! Server-sent events as OpenAI streams them: frames split at the blank
//! line that ends each event (`\n\n` or `\r\n\r\n`), and the few facts the
//! gateway needs of a frame (the end marker, usage, content, an error),
//! found without parsing the frames that cannot carry them.

use bytes::{Bytes, BytesMut};
use memchr::memmem;
use serde::Deserialize;
use serde_json::Value;

use crate::upstream::Usage;

/// Splits a byte stream into whole SSE frames, each with its terminator.
#[derive(Debug, Default)]
pub struct Splitter {
    buf: BytesMut,
    /// Where to resume looking for a terminator (the bytes before it have
    /// been searched already).
    scanned: usize,
}

impl Splitter {
    /// Appends bytes read from upstream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one is buffered.
    pub fn next_frame(&mut self) -> Option<Bytes> {
        let start = self.scanned.saturating_sub(3);
        let hay = &self.buf[start..];
        let end = terminator_end(hay).map(|e| start + e);
        match end {
            Some(end) => {
                self.scanned = 0;
                Some(self.buf.split_to(end).freeze())
            }
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }

    /// Whatever is left (a final frame without its blank line).
    pub fn rest(&mut self) -> Bytes {
        self.scanned = 0;
        self.buf.split().freeze()
    }

    /// Bytes buffered, not yet a whole frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// The index just past the first blank line in `hay`.
fn terminator_end(hay: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'\n', &hay[from..]) {
        let i = from + i;
        match hay.get(i + 1) {
            Some(b'\n') => return Some(i + 2),
            Some(b'\r') if hay.get(i + 2) == Some(&b'\n') => return Some(i + 3),
            _ => from = i + 1,
        }
    }
    None
}

/// What one frame says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Frame {
    /// `data: [DONE]`.
    pub done: bool,
    /// The usage it carries, if any.
    pub usage: Option<Usage>,
    /// It carries nothing but usage (`choices` empty): OpenAI's usage
    /// chunk.
    pub usage_only: bool,
    /// A delta with non-empty content (the first one is the time to first
    /// token).
    pub content: bool,
    /// An `error` object (an upstream's in-band failure).
    pub error: bool,
}

#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    choices: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

/// Usage as OpenAI reports it.
#[derive(Debug, Deserialize)]
pub struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
        }
    }
}

/// The data of a frame: its `data:` lines joined with `\n` (one line, as
/// OpenAI sends it, is borrowed).
fn data(frame: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    let mut lines = frame
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter_map(|l| l.strip_prefix(b"data:"))
        .map(|l| l.strip_prefix(b" ").unwrap_or(l));
    let first = lines.next()?;
    match lines.next() {
        None => Some(std::borrow::Cow::Borrowed(first)),
        Some(second) => {
            let mut joined = first.to_vec();
            joined.push(b'\n');
            joined.extend_from_slice(second);
            for l in lines {
                joined.push(b'\n');
                joined.extend_from_slice(l);
            }
            Some(std::borrow::Cow::Owned(joined))
        }
    }
}

/// Inspects one frame. Only frames that mention `"usage"` or `"error"`
/// are parsed; content is found by a byte search.
pub fn inspect(frame: &[u8]) -> Frame {
    let Some(data) = data(frame) else {
        return Frame::default();
    };
    let data = data.as_ref();
    if data.trim_ascii() == b"[DONE]" {
        return Frame {
            done: true,
            ..Frame::default()
        };
    }
    let mut out = Frame {
        content: has_content(data),
        ..Frame::default()
    };
    let usage = memmem::find(data, b"\"usage\"").is_some();
    let error = memmem::find(data, b"\"error\"").is_some();
    if usage || error {
        if let Ok(probe) = serde_json::from_slice::<Probe>(data) {
            out.usage_only = probe.usage.is_some() && probe.choices.is_none_or(|c| c.is_empty());
            out.usage = probe.usage.map(Usage::from);
            out.error = probe.error.is_some();
        }
    }
    out
}

/// Whether a chunk's delta has non-empty `content`.
fn has_content(data: &[u8]) -> bool {
    let finder = memmem::Finder::new(b"\"content\":");
    let mut from = 0;
    while let Some(i) = finder.find(&data[from..]) {
        let after = &data[from + i + 10..];
        let value = after.trim_ascii_start();
        if value.first() == Some(&b'"') && value.get(1) != Some(&b'"') {
            return true;
        }
        from += i + 10;
    }
    false
}

/// The frame without its `usage` (for an upstream that sends usage on a
/// chunk that also has choices, to a client that did not ask for usage).
pub fn without_usage(frame: &[u8]) -> Option<Bytes> {
    let data = data(frame)?;
    let mut value: Value = serde_json::from_slice(&data).ok()?;
    value.as_object_mut()?.remove("usage");
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, &value).ok()?;
    out.extend_from_slice(b"\n\n");
    Some(Bytes::from(out))
}

/// The event that ends a stream the upstream broke off: OpenAI's error
/// shape, which the SDKs raise as an API error.
pub fn error_frame(message: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": "server_error",
            "param": null,
            "code": "upstream_stream_error",
        }
    });
    Bytes::from(format!("data: {body}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_at_blank_lines_across_chunk_boundaries() {
        let text = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        for cut in 0..text.len() {
            let mut s = Splitter::default();
            let mut frames = Vec::new();
            for part in [&text[..cut], &text[cut..]] {
                s.push(part);
                while let Some(f) = s.next_frame() {
                    frames.push(f);
                }
            }
            assert_eq!(frames.len(), 3, "cut at {cut}");
            assert_eq!(&frames[1][..], b"data: {\"b\":2}\r\n\r\n");
            assert_eq!(s.buffered(), 0);
        }
    }

    #[test]
    fn the_usage_chunk_is_recognised_with_or_without_choices() {
        let only = inspect(br#"data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#);
        assert!(only.usage_only);
        assert_eq!(
            only.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3
            })
        );
        // The shape LiteLLM dropped: usage on a chunk that still has a choice.
        let mixed = inspect(br#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#);
        assert!(!mixed.usage_only);
        assert_eq!(mixed.usage.map(|u| u.completion_tokens), Some(3));
        let null = inspect(br#"data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}"#);
        assert!(null.usage.is_none() && null.content);
    }

    #[test]
    fn content_done_and_errors() {
        assert!(inspect(b"data: {\"choices\":[{\"delta\":{\"content\": \"x\"}}]}\n\n").content);
        assert!(
            !inspect(
                b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
            )
            .content
        );
        assert!(inspect(b"data: [DONE]\n\n").done);
        assert!(inspect(b"data: {\"error\":{\"message\":\"x\"}}\n\n").error);
        assert_eq!(inspect(b": keep-alive\n\n"), Frame::default());
    }

    #[test]
    fn usage_is_removed_from_a_mixed_chunk() {
        let out = without_usage(br#"data: {"choices":[{"index":0}],"usage":{"prompt_tokens":1}}"#)
            .expect("rewritten");
        let f = inspect(&out);
        assert!(f.usage.is_none());
        assert!(out.ends_with(b"\n\n"));
    }
}
