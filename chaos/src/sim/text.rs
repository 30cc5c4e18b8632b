//! Deterministic text processing shared by the fake LLM and the fake vector
//! store: tokens, sentences, word counts and the hashed bag-of-words
//! embedding. Everything here is a pure function so answers and rankings are
//! reproducible across runs, machines and processes.

/// Words too common to say anything about a passage; dropped from both the
/// embedding and the answer scoring so they neither match nor dilute.
const STOPWORDS: &[&str] = &[
    "about", "after", "all", "also", "and", "any", "are", "been", "before", "but", "can", "could",
    "did", "does", "each", "for", "from", "had", "has", "have", "how", "into", "its", "may",
    "more", "most", "must", "not", "our", "per", "should", "than", "that", "the", "their", "them",
    "then", "there", "they", "this", "was", "were", "what", "when", "where", "which", "who", "why",
    "will", "with", "would", "you", "your",
];

/// Shortest token, in characters, that counts as a content word.
const MIN_TOKEN_CHARS: usize = 3;

/// Content words of `text`: lowercase alphanumeric runs of at least three
/// characters, minus stopwords, with simple plurals folded to the singular
/// (`days` -> `day`, `policies` -> `policy`).
pub(crate) fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|raw| raw.chars().count() >= MIN_TOKEN_CHARS)
        .map(str::to_lowercase)
        .filter(|word| !STOPWORDS.contains(&word.as_str()))
        .map(singular)
        .collect()
}

/// Folds the commonest English plurals so "days" matches "day".
fn singular(word: String) -> String {
    let len = word.chars().count();
    if len > 4 && word.ends_with("ies") {
        format!("{}y", &word[..word.len() - 3])
    } else if len > 3
        && word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
    {
        word[..word.len() - 1].to_owned()
    } else {
        word
    }
}

/// FNV-1a, 64 bit: a fixed hash, so embeddings are identical in every
/// process (std's `RandomState` is seeded per process).
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The simulator's embedding of `text`: a hashed bag of [`tokens`] in `dim`
/// buckets, L2-normalised. Text without content words embeds to all zeros.
///
/// This is the function behind `/v1/embeddings` and the built-in collection,
/// exposed so tests can compute expected vectors without a round trip.
pub fn embed(text: &str, dim: usize) -> Vec<f32> {
    let mut vector = vec![0.0_f32; dim];
    if dim == 0 {
        return vector;
    }
    let buckets = dim as u64;
    for token in tokens(text) {
        let bucket = usize::try_from(fnv1a(token.as_bytes()) % buckets)
            .expect("a bucket below dim fits in usize");
        vector[bucket] += 1.0;
    }
    normalise(&mut vector);
    vector
}

/// Scales `vector` to unit length in place; the zero vector stays zero.
pub(crate) fn normalise(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Dot product; the cosine similarity of two unit vectors.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Number of whitespace-separated words: the simulator's token count.
pub(crate) fn word_count(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// Sentences of `text`, trimmed, in order. A sentence ends at `.`, `!` or
/// `?` followed by whitespace (or the end), or at a line break, so passage
/// headers on their own line are sentences too.
pub(crate) fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = match c {
            '\n' => Some((i, i + 1)),
            '.' | '!' | '?' => match chars.peek() {
                None => Some((i + 1, i + 1)),
                Some(&(_, next)) if next.is_whitespace() => Some((i + 1, i + 1)),
                Some(_) => None,
            },
            _ => None,
        };
        if let Some((stop, resume)) = end {
            out.push(text[start..stop].trim());
            start = resume;
        }
    }
    out.push(text[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_drop_short_words_and_stopwords_and_fold_plurals() {
        assert_eq!(
            tokens("Can I rollover more than 5 days of PTO policies?"),
            vec!["rollover", "day", "pto", "policy"]
        );
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn embeddings_are_unit_length_or_zero() {
        let v = embed("paid time off policy", 64);
        let norm = dot(&v, &v).sqrt();
        assert!((norm - 1.0).abs() < 1e-6, "norm {norm}");
        assert!(embed("a an of", 64).iter().all(|&x| x == 0.0));
    }

    #[test]
    fn sentences_split_on_terminators_and_lines_but_not_times() {
        assert_eq!(
            sentences("[1] Title\nCore hours are 10:00 to 15:00. Really? Yes!"),
            vec![
                "[1] Title",
                "Core hours are 10:00 to 15:00.",
                "Really?",
                "Yes!"
            ]
        );
    }

    #[test]
    fn word_count_counts_whitespace_separated_words() {
        assert_eq!(word_count("  one two\tthree\nfour "), 4);
        assert_eq!(word_count(""), 0);
    }
}
