//! Small text helpers shared by the built-in index and the built-in
//! answerer: tokenising, stop words, sentence splitting.

/// Words too common to say anything about relevance.
const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "are", "can", "what", "how", "does", "did", "was", "were", "you", "your",
    "our", "with", "from", "that", "this", "there", "their", "than", "have", "has", "will",
    "would", "should", "could", "about", "into", "any", "all", "who", "why", "when", "which",
    "more", "less", "get", "got", "may", "must", "not", "but", "its", "too", "also", "tell",
    "please", "much", "many", "some",
];

/// Lower-case content words of `text`: alphanumeric runs, stop words and
/// one- or two-letter words dropped (numbers are kept: "5 days" matters),
/// with a naive plural fold so "days" matches "day".
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| w.chars().all(|c| c.is_ascii_digit()) || w.chars().count() >= 3)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(fold_plural)
        .collect()
}

fn fold_plural(word: String) -> String {
    if word.len() > 3 && word.ends_with('s') && !word.ends_with("ss") {
        word[..word.len() - 1].to_owned()
    } else {
        word
    }
}

/// Splits text into sentences at `.`, `!` or `?` followed by whitespace.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for (i, c) in text.char_indices() {
        let end = i + c.len_utf8();
        let at_break =
            matches!(c, '.' | '!' | '?') && bytes.get(end).is_none_or(|b| b.is_ascii_whitespace());
        if at_break {
            let s = text[start..end].trim();
            if !s.is_empty() {
                out.push(s);
            }
            start = end;
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_keep_numbers_and_fold_plurals() {
        assert_eq!(
            tokens("Can I rollover more than 5 days?"),
            vec!["rollover", "5", "day"]
        );
        assert_eq!(tokens("What is the PTO policy?"), vec!["pto", "policy"]);
    }

    #[test]
    fn sentences_split_on_terminal_punctuation_only() {
        let s = sentences("Pay is 1.5 times. Really? Yes! done");
        assert_eq!(s, vec!["Pay is 1.5 times.", "Really?", "Yes!", "done"]);
    }
}
