//! The SSE relay's frame splitter and frame facts (`proxy::sse`).
//! Differential: the frames of a stream are the same however it is cut
//! into reads (whole, byte by byte, and at cut points drawn from the
//! input), agree with a naive reference splitter, and rejoin to the
//! input. Per frame: the facts are consistent, and a frame with usage
//! stripped is one whole frame that no longer carries usage.

#![no_main]

use bytes::Bytes;
use levee::proxy::sse::{inspect, without_usage, Splitter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let reference = naive(data);
    let whole = split(data, std::iter::repeat(data.len()));
    assert_eq!(whole, reference, "whole stream");
    let bytewise = split(data, std::iter::repeat(1));
    assert_eq!(bytewise, reference, "byte by byte");
    let cuts = Cuts(seed(data));
    assert_eq!(split(data, cuts), reference, "random cuts");

    let (frames, rest) = &reference;
    let rejoined: Vec<u8> = frames
        .iter()
        .chain(std::iter::once(rest))
        .flat_map(|f| f.to_vec())
        .collect();
    assert_eq!(rejoined, data);

    for frame in frames.iter().chain(std::iter::once(rest)) {
        let facts = inspect(frame);
        if facts.done {
            assert!(facts.usage.is_none() && !facts.content && !facts.error && !facts.usage_only);
        }
        if facts.usage_only {
            assert!(facts.usage.is_some());
        }
        if let Some(out) = without_usage(frame) {
            assert!(out.starts_with(b"data: ") && out.ends_with(b"\n\n"));
            let (frames, rest) = naive(&out);
            assert_eq!(frames, [out.clone()], "a rewritten frame is one frame");
            assert!(rest.is_empty());
            let facts = inspect(&out);
            assert!(facts.usage.is_none() && !facts.usage_only && !facts.done);
        }
    }
});

/// Feeds `data` in reads of the given lengths, draining frames after each.
fn split(data: &[u8], sizes: impl Iterator<Item = usize>) -> (Vec<Bytes>, Bytes) {
    let mut splitter = Splitter::default();
    let mut frames = Vec::new();
    let mut at = 0;
    for size in sizes {
        if at >= data.len() {
            break;
        }
        let end = (at + size.max(1)).min(data.len());
        splitter.push(&data[at..end]);
        at = end;
        while let Some(frame) = splitter.next_frame() {
            frames.push(frame);
        }
        assert!(splitter.buffered() <= at);
    }
    (frames, splitter.rest())
}

/// Frames end just past the first `\n\n` or `\n\r\n`.
fn naive(data: &[u8]) -> (Vec<Bytes>, Bytes) {
    let mut frames = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < data.len() {
        let end = if data[i] != b'\n' {
            None
        } else if data.get(i + 1) == Some(&b'\n') {
            Some(i + 2)
        } else if data.get(i + 1..i + 3) == Some(b"\r\n") {
            Some(i + 3)
        } else {
            None
        };
        match end {
            Some(end) => {
                frames.push(Bytes::copy_from_slice(&data[start..end]));
                start = end;
                i = end;
            }
            None => i += 1,
        }
    }
    (frames, Bytes::copy_from_slice(&data[start..]))
}

/// FNV-1a of the input: the cut points follow the bytes, so libFuzzer
/// explores them by mutating the stream.
fn seed(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1
}

/// Read lengths of 1 to 16 bytes from an xorshift generator.
struct Cuts(u64);

impl Iterator for Cuts {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Some((self.0 % 16) as usize + 1)
    }
}
