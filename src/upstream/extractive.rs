//! The built-in answerer: composes an answer from the retrieved passages'
//! most relevant sentences, with no network, so `levee serve` works with no
//! LLM configured.

use async_trait::async_trait;

use super::{Answer, Completion, Llm, Role, UpstreamError, Usage};
use crate::text;

/// Sentences quoted per answer.
const SENTENCES_PER_ANSWER: usize = 2;

/// Extractive answerer over retrieved passages and the thread's history.
#[derive(Debug, Clone, Default)]
pub struct ExtractiveAnswerer;

impl ExtractiveAnswerer {
    /// Composes the answer text (pure; the trait method wraps it).
    pub fn answer(request: Completion<'_>) -> String {
        let body = if request.passages.is_empty() {
            direct_answer(request.question)
        } else {
            extract(request)
        };
        // A follow-up says which earlier question it continues, so the
        // conversation is visible in the answer itself.
        let previous = request
            .history
            .iter()
            .rev()
            .find(|t| t.role == Role::User)
            .map(|t| t.content.as_str());
        match previous {
            Some(prev) => format!("Following up on \"{}\": {body}", first_sentence(prev)),
            None => body,
        }
    }
}

#[async_trait]
impl Llm for ExtractiveAnswerer {
    fn kind(&self) -> &'static str {
        "builtin"
    }

    async fn complete(&self, request: Completion<'_>) -> Result<Answer, UpstreamError> {
        let text = Self::answer(request);
        let prompt_words: usize = request.question.split_whitespace().count()
            + request
                .passages
                .iter()
                .map(|p| p.text.split_whitespace().count())
                .sum::<usize>()
            + request
                .history
                .iter()
                .map(|t| t.content.split_whitespace().count())
                .sum::<usize>();
        let usage = Usage {
            prompt_tokens: prompt_words as u64,
            completion_tokens: text.split_whitespace().count() as u64,
        };
        Ok(Answer { text, usage })
    }
}

fn direct_answer(question: &str) -> String {
    let lower = question.to_lowercase();
    if lower.contains("thank") {
        "You're welcome! Ask me anything about Acme Corp's HR and IT policies.".to_owned()
    } else {
        "Hello! I answer questions about Acme Corp's HR and IT policies, such as PTO, remote work, expenses, passwords and VPN access.".to_owned()
    }
}

fn extract(request: Completion<'_>) -> String {
    let question: Vec<String> = text::tokens(request.question);
    // (passage rank, sentence index, overlap, sentence)
    let mut scored: Vec<(usize, usize, usize, &str)> = Vec::new();
    for (rank, passage) in request.passages.iter().enumerate() {
        for (i, sentence) in text::sentences(&passage.text).into_iter().enumerate() {
            let mut words = text::tokens(sentence);
            words.sort();
            words.dedup();
            let overlap = words.iter().filter(|w| question.contains(w)).count();
            if overlap > 0 {
                scored.push((rank, i, overlap, sentence));
            }
        }
    }
    if scored.is_empty() {
        return "I could not find an answer to that in the knowledge base.".to_owned();
    }
    // Best overlap first; ties go to the better passage, then earlier text.
    scored.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    // Most relevant first, so a narrow follow-up leads with its answer.
    scored.truncate(SENTENCES_PER_ANSWER);
    scored.iter().map(|s| s.3).collect::<Vec<_>>().join(" ")
}

fn first_sentence(text: &str) -> &str {
    text::sentences(text).into_iter().next().unwrap_or(text)
}
